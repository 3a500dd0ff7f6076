package endpoint

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

func TestCAKeptWithItsKeyForRootAlone(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, CAKeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v, want mode 0600", fi, err)
	}
	again, err := LoadCA(dir)
	if err != nil || !bytes.Equal(again.PEM(), ca.PEM()) {
		t.Fatalf("a second load made another CA (%v)", err)
	}
	// A broken CA is replaced by a new one.
	os.WriteFile(filepath.Join(dir, CAKeyFile), []byte("garbage"), 0o600)
	fresh, err := LoadCA(dir)
	if err != nil || bytes.Equal(fresh.PEM(), ca.PEM()) {
		t.Fatalf("a broken CA was kept (%v)", err)
	}
}

// A client trusting the CA completes TLS with the server; a server with a certificate
// of another CA on the same address (an impostor) fails the client's verification.
func TestOnlyTheCAsServerIsTrusted(t *testing.T) {
	ca, err := LoadCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	certs := t.TempDir()
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	if changed, err := Trust(certs, addr, ca.PEM(), nil); err != nil || !changed {
		t.Fatalf("trust: %v %v", changed, err)
	}
	if changed, _ := Trust(certs, addr, ca.PEM(), nil); changed {
		t.Fatal("the same CA written twice")
	}
	pemBytes, _ := os.ReadFile(filepath.Join(certs, addr, "ca.crt"))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemBytes)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	s := &Server{Address: addr, CA: ca, Log: logrus.New(), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ours")) })}
	go func() { done <- s.Serve(ctx) }()
	var resp *http.Response
	for i := 0; i < 50; i++ {
		if resp, err = client.Get("https://" + addr + "/v2/"); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cancel()
	<-done

	// The impostor: its own CA, the same address.
	other, _ := LoadCA(t.TempDir())
	imp := &Server{Address: addr, CA: other, Log: logrus.New(), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("impostor")) })}
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go imp.Serve(ctx)
	time.Sleep(100 * time.Millisecond)
	client.CloseIdleConnections()
	_, err = client.Get("https://" + addr + "/v2/")
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("the impostor was trusted: %v", err)
	}
	if err := Untrust(certs, addr, ca.PEM()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(certs, addr)); !os.IsNotExist(err) {
		t.Fatalf("trust left behind: %v", err)
	}
}
