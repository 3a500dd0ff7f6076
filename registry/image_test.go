package registry

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/test/registrytest"
)

// OpenImage reads the platform's manifest of a list and streams its blobs.
func TestOpenImage(t *testing.T) {
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	arm, amd := layer(t, 1000), layer(t, 3000)
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: image(t, arm), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: image(t, amd), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	ref := reg.Host + "/" + reg.PushIndex("o/multi", idx, "")
	ctx := context.Background()
	src, err := resolver(f, Platform{OS: "linux", Architecture: "amd64"}, nil).OpenImage(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	m, err := src.Manifest(ctx)
	if err != nil || len(m.Layers) != 1 || m.Config.Digest == "" {
		t.Fatalf("%+v %v", m, err)
	}
	want, _ := amd.Digest()
	if m.Layers[0].Digest.String() != want.String() {
		t.Fatalf("layer %s, want amd64's %s", m.Layers[0].Digest, want)
	}
	rc, err := src.Blob(ctx, m.Layers[0])
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || int64(len(data)) != m.Layers[0].Size || digest.FromBytes(data) != m.Layers[0].Digest {
		t.Fatalf("%d bytes, %v", len(data), err)
	}
	// No instance for the platform: unavailable, as containers/image words it.
	s390, err := resolver(f, Platform{OS: "linux", Architecture: "s390x"}, nil).OpenImage(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	defer s390.Close()
	if _, err := s390.Manifest(ctx); !IsUnavailable(err) || !strings.Contains(err.Error(), "no image found in") {
		t.Fatalf("s390x: %v", err)
	}
}

// A registry that accepts connections and never answers fails OpenImage after the
// Client's Timeout, saying so (a transient failure).
func TestOpenImageTimesOut(t *testing.T) {
	l := silentListener(t)
	f := newFiles(t, "")
	r := New(Config{RegistriesConf: f.Conf, RegistriesConfDir: f.ConfDir, CertsDir: f.Certs,
		Platform: Platform{OS: "linux", Architecture: "amd64"}, Timeout: 200 * time.Millisecond}, nil)
	stalled := l.Addr().String() + "/x/stalled"
	start := time.Now()
	_, err := r.OpenImage(context.Background(), stalled+"@sha256:"+strings.Repeat("5", 64))
	if err == nil || !strings.Contains(err.Error(), "no answer from its registry within 200ms") || IsUnavailable(err) {
		t.Fatalf("open: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("waited %s", took)
	}
}

// A blob's body past its size is an error, not more bytes.
func TestBlobBodyBounded(t *testing.T) {
	b := &boundedBody{rc: io.NopCloser(strings.NewReader("0123456789")), cancel: func() {}, left: 4, d: "sha256:x"}
	data, err := io.ReadAll(b)
	if !errors.Is(err, errBlobTooLong) || string(data) != "0123" {
		t.Fatalf("%q %v", data, err)
	}
	b = &boundedBody{rc: io.NopCloser(strings.NewReader("0123")), cancel: func() {}, left: 4, d: "sha256:x"}
	if data, err := io.ReadAll(b); err != nil || string(data) != "0123" {
		t.Fatalf("exact: %q %v", data, err)
	}
}
