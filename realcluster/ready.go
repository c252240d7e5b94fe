// Readiness of one run: the API server answers /readyz with 200 (all its post-start hooks,
// including the RBAC bootstrap, have run) and the controllers have acted once (the "default"
// ServiceAccount exists in namespace "default"), so a test never races the control plane's start.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

const readyTimeout = 180 * time.Second

// waitReady polls /readyz until it returns 200, the API server fails, or the timeout passes.
func waitReady(ctx context.Context, server string, caPEM []byte, token string, apiDone chan error) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return errors.New("the generated CA certificate does not parse")
	}
	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}
	deadline := time.After(readyTimeout)
	lastErr := errors.New("no answer yet")
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, server+"/readyz", nil)
		if err != nil {
			return fmt.Errorf("building the readiness request: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			lastErr = fmt.Errorf("/readyz answered %d: %s", resp.StatusCode, body)
		} else {
			lastErr = err
		}
		select {
		case err := <-apiDone:
			return fmt.Errorf("kube-apiserver stopped before it was ready: %w", err)
		case <-ctx.Done():
			return errors.New("stopped before the API server was ready")
		case <-deadline:
			return fmt.Errorf("kube-apiserver not ready within %s: %w", readyTimeout, lastErr)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitControllers waits until the ServiceAccount controller has created default/default.
func waitControllers(ctx context.Context, kubeconfig string, ctrlDone chan error) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("reading %s: %w", kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("building a client: %w", err)
	}
	deadline := time.After(readyTimeout)
	for {
		_, err := client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsNotFound(err) && ctx.Err() == nil {
			return fmt.Errorf("checking the default ServiceAccount: %w", err)
		}
		select {
		case err := <-ctrlDone:
			return fmt.Errorf("controllers stopped before they were ready: %w", err)
		case <-ctx.Done():
			return errors.New("stopped before the controllers were ready")
		case <-deadline:
			return fmt.Errorf("controllers not ready within %s", readyTimeout)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
