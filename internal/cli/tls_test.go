package cli

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCA writes a CA and a certificate it signed for 127.0.0.1, as PEM
// files: the CA's certificate, the server's certificate and its key.
func testCA(t *testing.T) (caFile, certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "poolplanner test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srv := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(srvKey)
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server-key.pem", "EC PRIVATE KEY", keyDER)
}

// TestServeTLS: planner serve with --tls-cert and --tls-key; a client
// without --tls-ca cannot verify the server and says what to pass; with
// it, the client works (and with --auth, with credentials).
func TestServeTLS(t *testing.T) {
	caFile, certFile, keyFile := testCA(t)
	addr := freeAddr(t)
	dataDir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var serveErr bytes.Buffer
	go func() {
		done <- Main(ctx, []string{"serve", "--listen", addr, "--data-dir", dataDir, "--auth", "--tls-cert", certFile, "--tls-key", keyFile,
			"--spec", "../../examples/disaggregate.yaml", "--simulate", "4x8xH100", "--no-local-reporter", "--log-level", "warn"}, nil, &bytes.Buffer{}, &serveErr)
	}()
	defer func() { cancel(); <-done }()
	server := "nats://" + addr
	launcher := filepath.Join(dataDir, "creds", "launcher.creds")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serve: %s", serveErr.String())
		}
	})
	runUntil(t, 30*time.Second, func(code int, out string) bool { return code == 0 && strings.Contains(out, "first plan") },
		"history", "--server", server, "--creds", launcher, "--tls-ca", caFile)
	var code int
	var errOut string
	code, _, errOut = run(t, "history", "--server", server, "--creds", launcher)
	if code == 0 || !strings.Contains(errOut, "pass --tls-ca") {
		t.Errorf("without --tls-ca: exit %d, stderr %q", code, errOut)
	}
	code, _, errOut = run(t, "history", "--server", server, "--tls-ca", caFile)
	if code == 0 || !strings.Contains(errOut, "requires credentials") {
		t.Errorf("without --creds: exit %d, stderr %q", code, errOut)
	}
}
