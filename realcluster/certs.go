// Certificates and keys for one run of the real cluster, all generated in memory and written to
// the run's directory: a self-signed CA, a serving certificate for the API server signed by it
// (valid for 127.0.0.1, localhost and the in-cluster service names) and the ServiceAccount
// token signing key pair. Nothing is reused between runs and nothing leaves the run directory.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the paths of the files written by writePKI and the CA bundle for the kubeconfig.
type pki struct {
	caCertFile    string
	caCertPEM     []byte
	servingCert   string
	servingKey    string
	saPublicKey   string
	saSigningKey  string
	tokenAuthFile string
}

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("encoding key %s: %w", path, err)
	}
	return writePEM(path, "EC PRIVATE KEY", der)
}

// writePKI generates the CA, the serving certificate, the ServiceAccount keys and the static
// token file (one bearer token in group system:masters) under dir.
func writePKI(dir, token string) (*pki, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	caSerial, err := newSerial()
	if err != nil {
		return nil, err
	}
	caTemplate := &x509.Certificate{
		SerialNumber:          caSerial,
		Subject:               pkix.Name{CommonName: "wasmctrl-realcluster-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("signing CA certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate: %w", err)
	}

	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating serving key: %w", err)
	}
	servingSerial, err := newSerial()
	if err != nil {
		return nil, err
	}
	servingTemplate := &x509.Certificate{
		SerialNumber: servingSerial,
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
		DNSNames: []string{
			"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local",
		},
	}
	servingDER, err := x509.CreateCertificate(rand.Reader, servingTemplate, caCert, &servingKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("signing serving certificate: %w", err)
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating ServiceAccount signing key: %w", err)
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("encoding ServiceAccount public key: %w", err)
	}

	p := &pki{
		caCertFile:    filepath.Join(dir, "ca.crt"),
		caCertPEM:     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		servingCert:   filepath.Join(dir, "apiserver.crt"),
		servingKey:    filepath.Join(dir, "apiserver.key"),
		saPublicKey:   filepath.Join(dir, "sa.pub"),
		saSigningKey:  filepath.Join(dir, "sa.key"),
		tokenAuthFile: filepath.Join(dir, "tokens.csv"),
	}
	if err := os.WriteFile(p.caCertFile, p.caCertPEM, 0o600); err != nil {
		return nil, fmt.Errorf("writing %s: %w", p.caCertFile, err)
	}
	if err := writePEM(p.servingCert, "CERTIFICATE", servingDER); err != nil {
		return nil, fmt.Errorf("writing %s: %w", p.servingCert, err)
	}
	if err := writeKey(p.servingKey, servingKey); err != nil {
		return nil, err
	}
	if err := writePEM(p.saPublicKey, "PUBLIC KEY", saPub); err != nil {
		return nil, fmt.Errorf("writing %s: %w", p.saPublicKey, err)
	}
	if err := writeKey(p.saSigningKey, saKey); err != nil {
		return nil, err
	}
	// Static token file: token,user,uid,"group1,group2".
	line := fmt.Sprintf("%s,wasmctrl-admin,wasmctrl-admin,\"system:masters\"\n", token)
	if err := os.WriteFile(p.tokenAuthFile, []byte(line), 0o600); err != nil {
		return nil, fmt.Errorf("writing %s: %w", p.tokenAuthFile, err)
	}
	return p, nil
}
