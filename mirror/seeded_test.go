package mirror

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"sync/atomic"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	ggcrlayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepin/imagepin/seed"
)

// goneSource is a registry that does not exist: every request fails, counted.
type goneSource struct{ calls atomic.Int64 }

func (s *goneSource) Manifest(context.Context, string, []digest.Digest, digest.Digest, int64) ([]byte, string, error) {
	s.calls.Add(1)
	return nil, "", errors.New("dial tcp: lookup seeded.example.invalid: no such host")
}

func (s *goneSource) Blob(context.Context, string, []digest.Digest, digest.Digest, int64) (io.ReadCloser, int64, error) {
	s.calls.Add(1)
	return nil, 0, errors.New("dial tcp: lookup seeded.example.invalid: no such host")
}

// A pinned image that imagepinctl seed put in the store is served from it, manifest
// and blobs, with a source that fails every request (the registry does not exist): the
// source is never asked. An image the store holds but nothing pins is not served.
func TestSeededImageServedWithoutItsRegistry(t *testing.T) {
	const seededRepo = "seeded.example.invalid/app"
	dir := filepath.Join(t.TempDir(), "oci")
	p, err := ggcrlayout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	img, err := random.Image(128<<10, 3)
	if err != nil {
		t.Fatal(err)
	}
	other, err := random.Image(1024, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		img  v1.Image
		name string
	}{{img, seededRepo + ":v1"}, {other, seededRepo + ":other"}} {
		if err := p.AppendImage(x.img, ggcrlayout.WithAnnotations(map[string]string{ocispec.AnnotationRefName: x.name})); err != nil {
			t.Fatal(err)
		}
	}
	src := &goneSource{}
	d, _ := img.Digest()
	od, _ := other.Digest()
	s := serve(t, src, func(r string, dd digest.Digest) bool { return r == seededRepo && dd.String() == d.String() })
	t.Cleanup(s.m.Close)
	seeder := seed.New(seed.Config{Dir: seed.Dir(t.TempDir()), StoreDir: s.dir}, seed.Deps{Store: s.store})
	if _, err := seeder.Seed(context.Background(), dir); err != nil {
		t.Fatal(err)
	}

	layers := pullThrough(t, s.srv, PathFor(seededRepo), d)
	if len(layers) != 3 {
		t.Fatalf("%d layers, want 3", len(layers))
	}
	if n := src.calls.Load(); n != 0 {
		t.Fatalf("the source was asked %d times for a seeded image", n)
	}
	if s.stats.FromStore.Load() == 0 || s.stats.Transferred.Load() != 0 {
		t.Fatalf("from the store %d bytes, transferred %d: want all from the store", s.stats.FromStore.Load(), s.stats.Transferred.Load())
	}
	resp, err := s.srv.Client().Get(s.srv.URL + "/v2/" + PathFor(seededRepo) + "/manifests/" + od.String())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("a seeded image nothing pins: status %d, want 404", resp.StatusCode)
	}
}
