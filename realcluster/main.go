// Command realcluster runs a real Kubernetes control plane in one process for tests: embedded
// etcd, kube-apiserver and the garbage-collector, namespace and ServiceAccount controllers of
// kube-controller-manager, all from the published Kubernetes modules of one pinned release.
//
// It listens on 127.0.0.1 only, keeps its data in a fresh directory (removed on exit unless
// --data-dir names one), writes an admin kubeconfig to --kubeconfig and then prints exactly one
// line starting with "realcluster: ready" on stdout. It stops cleanly on SIGTERM or SIGINT, and
// on end of standard input with --exit-on-stdin-close (so a parent that dies takes it along).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
	utilversion "k8s.io/component-base/version"
	"k8s.io/klog/v2"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "realcluster: %v\n", err)
		os.Exit(1)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func run() error {
	kubeconfig := flag.String("kubeconfig", "", "where to write the admin kubeconfig (required)")
	dataDir := flag.String("data-dir", "", "directory for etcd data and certificates (default: a fresh temporary directory, removed on exit)")
	stdinClose := flag.Bool("exit-on-stdin-close", false, "stop when standard input reaches end of file")
	verbosity := flag.Int("v", 0, "log verbosity of the Kubernetes components (logs go to stderr)")
	flag.Parse()
	if *kubeconfig == "" {
		return errors.New("--kubeconfig is required")
	}
	kubeconfigPath, err := filepath.Abs(*kubeconfig)
	if err != nil {
		return fmt.Errorf("resolving --kubeconfig: %w", err)
	}

	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	if err := klogFlags.Set("v", fmt.Sprint(*verbosity)); err != nil {
		return fmt.Errorf("setting log verbosity: %w", err)
	}

	started := time.Now()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *stdinClose {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			stop()
		}()
	}

	dir := *dataDir
	if dir == "" {
		dir, err = os.MkdirTemp("", "realcluster-")
		if err != nil {
			return fmt.Errorf("creating the data directory: %w", err)
		}
		defer os.RemoveAll(dir)
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating --data-dir %s: %w", dir, err)
	}

	tokenBytes := make([]byte, 24)
	if _, err := rand.Read(tokenBytes); err != nil {
		return fmt.Errorf("generating the bearer token: %w", err)
	}
	token := hex.EncodeToString(tokenBytes)
	p, err := writePKI(dir, token)
	if err != nil {
		return err
	}

	etcd, etcdURL, err := startEtcd(dir)
	if err != nil {
		return err
	}
	defer etcd.Close()

	port, err := freePort()
	if err != nil {
		return err
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", port)
	if err := writeKubeconfig(kubeconfigPath, server, p.caCertPEM, token); err != nil {
		return err
	}

	// Both components share the process-wide feature gates and effective version, registered
	// once as the kube-apiserver command does.
	_, _ = featuregate.DefaultComponentGlobalsRegistry.ComponentGlobalsOrRegister(
		featuregate.DefaultKubeComponent, utilversion.DefaultBuildEffectiveVersion(), utilfeature.DefaultMutableFeatureGate)
	api, err := newAPIServer(apiServerArgs(etcdURL, port, p))
	if err != nil {
		return err
	}
	controllers, err := newControllerManager(kubeconfigPath, p)
	if err != nil {
		return err
	}
	if err := featuregate.DefaultComponentGlobalsRegistry.Set(); err != nil {
		return fmt.Errorf("applying feature gates: %w", err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	apiDone := make(chan error, 1)
	go func() { apiDone <- api.run(runCtx) }()

	if err := waitReady(runCtx, server, p.caCertPEM, token, apiDone); err != nil {
		cancel()
		return err
	}
	ctrlDone := make(chan error, 1)
	go func() { ctrlDone <- controllers.run(runCtx) }()
	if err := waitControllers(runCtx, kubeconfigPath, ctrlDone); err != nil {
		cancel()
		return err
	}

	fmt.Printf("realcluster: ready server=%s kubeconfig=%s startup=%.2fs\n",
		server, kubeconfigPath, time.Since(started).Seconds())

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-apiDone:
		runErr = fmt.Errorf("kube-apiserver stopped: %w", err)
		apiDone <- nil
	case err := <-ctrlDone:
		runErr = fmt.Errorf("controllers stopped: %w", err)
		ctrlDone <- nil
	}
	cancel()
	// The API server drains its requests and the controllers their queues; a component that
	// does not stop within the grace period is left behind by the exit.
	grace := time.After(15 * time.Second)
	for _, done := range []chan error{apiDone, ctrlDone} {
		select {
		case <-done:
		case <-grace:
			fmt.Fprintln(os.Stderr, "realcluster: a component did not stop within 15s")
		}
	}
	return runErr
}
