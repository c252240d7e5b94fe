// Command registry runs the CNCF Distribution registry (github.com/distribution/distribution/v3,
// the code of its cmd/registry) for tests: in-memory storage, on 127.0.0.1 only, on a free port.
//
// With --htpasswd USER:PASSWORD it requires that user (HTTP basic auth, as the registry's
// htpasswd access controller does it); with --tls-dir DIR it serves HTTPS with a certificate
// for 127.0.0.1 and localhost, signed by a fresh CA written to DIR/ca.pem. Once it serves it
// prints exactly one line starting with "registry: ready" (with address=HOST:PORT) on stdout.
// It stops on SIGTERM or SIGINT, and on end of standard input with --exit-on-stdin-close (so a
// parent that dies takes it along).
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	"golang.org/x/crypto/bcrypt"

	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "registry: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	htpasswd := flag.String("htpasswd", "", "USER:PASSWORD the registry requires (default: no authentication)")
	tlsDir := flag.String("tls-dir", "", "serve HTTPS; the CA that signed the certificate goes to DIR/ca.pem")
	stdinClose := flag.Bool("exit-on-stdin-close", false, "stop when standard input reaches end of file")
	flag.Parse()

	work, err := os.MkdirTemp("", "wasmctrl-registry-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	config := "version: 0.1\n" +
		"log:\n  level: warn\n  accesslog:\n    disabled: true\n" +
		"storage:\n  inmemory: {}\n  delete:\n    enabled: true\n" +
		"  maintenance:\n    uploadpurging:\n      enabled: false\n" +
		"http:\n  addr: 127.0.0.1:0\n"
	if *htpasswd != "" {
		user, password, ok := strings.Cut(*htpasswd, ":")
		if !ok || user == "" {
			return errors.New("--htpasswd must be USER:PASSWORD")
		}
		hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
		if err != nil {
			return fmt.Errorf("hashing the password: %w", err)
		}
		file := filepath.Join(work, "htpasswd")
		if err := os.WriteFile(file, []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
			return err
		}
		config += fmt.Sprintf("auth:\n  htpasswd:\n    realm: wasmctrl-test\n    path: %s\n", file)
	}
	parsed, err := configuration.Parse(strings.NewReader(config))
	if err != nil {
		return fmt.Errorf("registry configuration: %w", err)
	}

	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listening on loopback: %w", err)
	}
	scheme := "http"
	if *tlsDir != "" {
		certificate, err := selfSigned(*tlsDir)
		if err != nil {
			return fmt.Errorf("certificates: %w", err)
		}
		listener = tls.NewListener(listener, &tls.Config{Certificates: []tls.Certificate{certificate}, MinVersion: tls.VersionTLS12})
		scheme = "https"
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	app := handlers.NewApp(ctx, parsed)
	server := &http.Server{Handler: app, ReadHeaderTimeout: 30 * time.Second}
	served := make(chan error, 1)
	go func() { served <- server.Serve(listener) }()
	fmt.Printf("registry: ready address=%s scheme=%s\n", listener.Addr().String(), scheme)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	stdinDone := make(chan struct{})
	if *stdinClose {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			close(stdinDone)
		}()
	}
	select {
	case <-stop:
	case <-stdinDone:
	case err := <-served:
		return err
	}
	shutdown, done := context.WithTimeout(context.Background(), 5*time.Second)
	defer done()
	return server.Shutdown(shutdown)
}

// selfSigned makes a CA (written to dir/ca.pem) and a server certificate it signs for
// 127.0.0.1 and localhost.
func selfSigned(dir string) (tls.Certificate, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tls.Certificate{}, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "wasmctrl test registry CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), caPEM, 0o600); err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}, nil
}
