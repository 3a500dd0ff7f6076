package mirror

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/test/registrytest"
)

// A registry that takes the mirror's manifest request and never answers ends the fetch
// after stallTimeout, as a blob's fill ends: the fetch runs on a context no request
// cancels while others wait on it, and used to run as long as any did.
func TestARegistryThatNeverAnswersAManifestIsLeft(t *testing.T) {
	old := stallTimeout
	stallTimeout = 300 * time.Millisecond
	t.Cleanup(func() { stallTimeout = old })
	gone := make(chan struct{})
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // takes the request, answers nothing
		case <-r.Context().Done():
		case <-gone:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(gone) })
	host := strings.TrimPrefix(srv.URL, "https://")
	f := registrytest.NewFiles(t, "")
	os.MkdirAll(filepath.Join(f.Certs, host), 0o755)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(filepath.Join(f.Certs, host, "ca.crt"), ca, 0o644); err != nil {
		t.Fatal(err)
	}
	src := FromRegistry(registry.New(registry.Config{RegistriesConf: f.Conf, RegistriesConfDir: f.ConfDir, CertsDir: f.Certs}, nil))
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, _, err := src.Manifest(context.Background(), host+"/ns/app", nil, digest.FromString("a manifest"), -1)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("no error from a registry that never answered")
		}
		t.Logf("left after %s: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(5 * time.Second):
		t.Fatal("the manifest fetch still waits on a registry that never answers")
	}
}
