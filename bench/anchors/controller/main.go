// Command controller is the controller-runtime anchor for the latency benchmark: a
// controller for ConfigMaps with a no-op reconcile and MaxConcurrentReconciles 1 (the
// default), in a manager with controller-runtime's defaults otherwise (no metrics server,
// no probes, no leader election), reading the benchmark's stream server.
//
// Its client speaks what controller-runtime v0.25.2 picks by default: protobuf for types its
// protobuf scheme recognises, ConfigMap among them (apiutil.createRestConfig sets
// rest.Config.ContentType to application/vnd.kubernetes.protobuf when it is unset). The
// result line names the Content-Type the server answered with (`wire`) and the Go runtime's
// GOMAXPROCS, GOGC and version.
//
// At the start of each reconcile it reads the object from the manager's cache (without a
// deep copy, so the read costs what a pointer lookup costs) and takes now − the object's sent
// stamp, as the Rust consumers do (host/benches/anchors.rs). It prints one JSON line with
// p50 / p99 / max over the updates after the first tenth.
//
// The WatchListClient feature is turned off for the reason given in ../informer.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"wasmctrl.example/bench/anchors/internal/measure"
)

type noop struct {
	reader  client.Reader
	last    uint64
	mu      sync.Mutex
	samples []measure.Sample
	done    chan struct{}
	once    sync.Once
}

func (r *noop) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	now := time.Now()
	var cm corev1.ConfigMap
	unsafe := true
	if err := r.reader.Get(ctx, req.NamespacedName, &cm, &client.GetOptions{UnsafeDisableDeepCopy: &unsafe}); err != nil {
		return ctrl.Result{}, nil
	}
	if s, ok := measure.FromAnnotations(cm.Annotations, now); ok {
		r.mu.Lock()
		r.samples = append(r.samples, s)
		r.mu.Unlock()
		if s.Seq == r.last {
			r.once.Do(func() { close(r.done) })
		}
	}
	return ctrl.Result{}, nil
}

func main() {
	if err := os.Setenv("KUBE_FEATURE_WatchListClient", "false"); err != nil {
		measure.Fail(err)
	}
	url := flag.String("url", "", "the stream server, http://127.0.0.1:PORT")
	updates := flag.Uint64("updates", 0, "updates in the watch stream")
	rate := flag.Int("rate", 0, "the stream's pace in updates/s (reported only)")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	flag.Parse()
	if *url == "" || *updates == 0 {
		measure.Fail(fmt.Errorf("usage: controller -url URL -updates M [-rate R]"))
	}
	ctrl.SetLogger(logr.Discard())

	var wire measure.ContentTypes
	mgr, err := ctrl.NewManager(&rest.Config{Host: *url, WrapTransport: wire.Wrap}, ctrl.Options{
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		measure.Fail(fmt.Errorf("manager for %s: %w", *url, err))
	}
	r := &noop{reader: mgr.GetCache(), last: *updates - 1, done: make(chan struct{})}
	err = ctrl.NewControllerManagedBy(mgr).
		For(&corev1.ConfigMap{}).
		Named("bench").
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(r)
	if err != nil {
		measure.Fail(fmt.Errorf("controller: %w", err))
	}

	ctx, cancel := context.WithCancel(context.Background())
	failed := make(chan error, 1)
	go func() { failed <- mgr.Start(ctx) }()
	select {
	case <-r.done:
	case err := <-failed:
		measure.Fail(fmt.Errorf("manager stopped: %v", err))
	case <-time.After(*timeout):
		r.mu.Lock()
		n := len(r.samples)
		r.mu.Unlock()
		measure.Fail(fmt.Errorf("timed out after %s with %d reconciles of updates", *timeout, n))
	}
	cancel()

	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := measure.Compute(r.samples, *updates/10)
	if !ok {
		measure.Fail(fmt.Errorf("no reconcile of an update after the first tenth"))
	}
	measure.Emit(map[string]any{
		"impl":       "controller-runtime",
		"wire":       wire.Seen(),
		"env":        measure.Environment(),
		"delivery":   measure.Delivery(r.samples, *updates/10),
		"kind":       "latency",
		"rate":       *rate,
		"updates":    *updates,
		"reconciles": len(r.samples),
		"samples":    p.Count,
		"p50_ms":     float64(p.P50) / 1e6,
		"p99_ms":     float64(p.P99) / 1e6,
		"max_ms":     float64(p.Max) / 1e6,
	})
}
