// Command informer is the client-go anchor for the informer benchmark: a
// SharedIndexInformer for ConfigMaps (typed, from a SharedInformerFactory, as client-go's
// users write it) reading the benchmark's stream server. It prints one JSON line: the watch
// events per second delivered to an event handler, and the heap the cache holds per object.
//
// Measured the same way as the Rust consumers (host/benches/anchors.rs): the clock starts
// when the handler has seen every listed object and stops when it sees the last update;
// cache bytes are the live heap after the stream (after a GC) minus the live heap before
// the informer started, divided by the number of objects.
//
// Nothing in it throttles or adds work: client-go's client-side rate limit (QPS 5, burst 10)
// applies to requests, and there are two (the list and the watch); there is no resync; the
// handler only counts. `-cpuprofile FILE` writes a CPU profile of the run (`go tool pprof
// -top informer FILE`).
//
// `-content-type` picks the encoding through rest.Config.ContentType: `json` asks for
// application/json only; `protobuf` for application/vnd.kubernetes.protobuf (what client-go
// v0.37.2's typed ConfigMap client asks for first when ContentType is left unset:
// gentype.PrefersProtobuf). The result line names the Content-Type the server answered with (`wire`)
// and the Go runtime's GOMAXPROCS, GOGC and version.
//
// The stream server speaks list + watch, not the watch-list protocol (sendInitialEvents),
// so the WatchListClient feature, on by default since client-go 1.35, is turned off here;
// every consumer then reads the same list and the same watch.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"wasmctrl.example/bench/anchors/internal/measure"
)

func main() {
	if err := os.Setenv("KUBE_FEATURE_WatchListClient", "false"); err != nil {
		measure.Fail(err)
	}
	url := flag.String("url", "", "the stream server, http://127.0.0.1:PORT")
	objects := flag.Int64("objects", 20000, "objects in the initial list")
	updates := flag.Uint64("updates", 200000, "updates in the watch stream")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the watch phase to this file")
	contentType := flag.String("content-type", "json", "json or protobuf")
	flag.Parse()
	if *url == "" || *objects <= 0 || *updates == 0 {
		measure.Fail(fmt.Errorf("usage: informer -url URL -objects N -updates M [-content-type json|protobuf]"))
	}
	config := &rest.Config{Host: *url}
	switch *contentType {
	case "json":
		config.ContentType = "application/json"
	case "protobuf":
		config.ContentType = "application/vnd.kubernetes.protobuf"
	default:
		measure.Fail(fmt.Errorf("-content-type %q: want json or protobuf", *contentType))
	}
	var wire measure.ContentTypes
	config.WrapTransport = wire.Wrap

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	clientset, err := kubernetes.NewForConfig(config)
	if err != nil {
		measure.Fail(fmt.Errorf("client for %s: %w", *url, err))
	}
	factory := informers.NewSharedInformerFactory(clientset, 0)
	informer := factory.Core().V1().ConfigMaps().Informer()

	lastSeq := strconv.FormatUint(*updates-1, 10)
	var adds, seen atomic.Int64
	var syncedAt, doneAt atomic.Int64
	done := make(chan struct{})
	_, err = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if adds.Add(1) == *objects {
				syncedAt.Store(time.Now().UnixNano())
			}
		},
		UpdateFunc: func(_, obj any) {
			seen.Add(1)
			cm, ok := obj.(*corev1.ConfigMap)
			if ok && cm.Annotations[measure.SeqAnnotation] == lastSeq {
				doneAt.Store(time.Now().UnixNano())
				close(done)
			}
		},
	})
	if err != nil {
		measure.Fail(fmt.Errorf("adding the handler: %w", err))
	}

	start := time.Now()
	stop := make(chan struct{})
	factory.Start(stop)
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			measure.Fail(fmt.Errorf("creating the CPU profile: %w", err))
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			measure.Fail(fmt.Errorf("starting the CPU profile: %w", err))
		}
	}
	select {
	case <-done:
	case <-time.After(*timeout):
		measure.Fail(fmt.Errorf("timed out after %s: %d of %d listed objects, %d of %d updates seen",
			*timeout, adds.Load(), *objects, seen.Load(), *updates))
	}
	if *cpuProfile != "" {
		pprof.StopCPUProfile()
	}

	runtime.GC()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	cached := len(informer.GetStore().ListKeys())
	close(stop)
	factory.Shutdown()

	watchSeconds := float64(doneAt.Load()-syncedAt.Load()) / 1e9
	measure.Emit(map[string]any{
		"impl":                   "client-go",
		"content_type":           *contentType,
		"wire":                   wire.Seen(),
		"env":                    measure.Environment(),
		"kind":                   "informer",
		"objects":                *objects,
		"cached":                 cached,
		"updates_seen":           seen.Load(),
		"list_seconds":           float64(syncedAt.Load()-start.UnixNano()) / 1e9,
		"watch_seconds":          watchSeconds,
		"events_per_sec":         float64(seen.Load()) / watchSeconds,
		"cache_bytes_per_object": (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(*objects),
	})
}
