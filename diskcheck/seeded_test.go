package diskcheck

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	ggcrlayout "github.com/google/go-containerregistry/pkg/v1/layout"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/seed"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/registrytest"
)

// A seeded image is sized from the node's store, with no registry (its host does not
// resolve), and its layers, on disk already in the store, need no room for a copy in
// it; an image from a registry that shares a seeded layer needs none for that layer
// either.
func TestSeededImagesAreSizedFromTheStore(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	storeDir := filepath.Join(root, "blobs")
	store, err := blobstore.Open(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	base, u1, u2 := layer(t, 20000), layer(t, 3000), layer(t, 7000)
	seeded := image(t, base, u1)
	media := filepath.Join(root, "oci")
	p, err := ggcrlayout.Write(media, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(seeded, ggcrlayout.WithAnnotations(map[string]string{ocispec.AnnotationRefName: "seeded.example.invalid/app:v1"})); err != nil {
		t.Fatal(err)
	}
	if _, err := seed.New(seed.Config{Dir: seed.Dir(filepath.Join(root, "state")), StoreDir: storeDir}, seed.Deps{Store: store}).Seed(ctx, media); err != nil {
		t.Fatal(err)
	}
	sd, _ := seeded.Digest()
	seededRef := "seeded.example.invalid/app@" + sd.String()

	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	fetched := reg.Host + "/" + reg.Push("a/fetched", image(t, base, u2), "")

	sets := []SetRequest{{Name: "a-seeded", Missing: []string{seededRef}}, {Name: "b-fetched", Missing: []string{fetched}}}
	// What pulling takes (Need), + compressed for the store where it lacks the layer.
	needSeeded := need(t, base) + need(t, u1)
	needFetched := need(t, u2) + layerBytes(t, u2)
	check := func(available uint64) Result {
		t.Helper()
		c := New(Config{NodeName: "n1", Multiplier: 2, GCHighThresholdPercent: 100, KeepsCompressed: true, ThroughMirror: true, Store: store},
			resolver(f, registry.Platform{}, nil), func(context.Context) (string, error) { return "/var/lib/containers/storage", nil })
		c.statfs = func(string) (Space, error) { return Space{Capacity: 1 << 40, Available: available}, nil }
		res, err := c.Check(ctx, sets, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := check(needSeeded + needFetched)
	a, b := res.Verdicts["a-seeded"], res.Verdicts["b-fetched"]
	if !a.Admitted || !b.Admitted || a.Condition.Status != status.True || b.Condition.Status != status.True {
		t.Fatalf("not admitted with exactly the need free: %+v / %+v", a.Condition, b.Condition)
	}
	if a.Bytes[seededRef] != layerBytes(t, base, u1) || len(a.Unavailable)+len(a.Unsized) != 0 {
		t.Fatalf("the seeded image: bytes %v, unavailable %v, unsized %v", a.Bytes, a.Unavailable, a.Unsized)
	}
	if !strings.Contains(a.Condition.Message, "+ 0 B compressed for the node-local mirror's store") ||
		!strings.Contains(a.Condition.Message, "in the node's store already") {
		t.Fatalf("message: %s", a.Condition.Message)
	}
	if len(a.Layers[seededRef]) != 2 {
		t.Fatalf("layers %v", a.Layers)
	}
	res = check(needSeeded + needFetched - 1)
	if !res.Verdicts["a-seeded"].Admitted || res.Verdicts["b-fetched"].Admitted {
		t.Fatalf("one byte short: %+v", res.Verdicts)
	}
}

// need is Need of l, its uncompressed size read from it.
func need(t *testing.T, l v1.Layer) uint64 {
	t.Helper()
	size, _ := l.Size()
	return Need(registry.Layer{Size: size, Uncompressed: int64(uncompressedSize(t, l))}, 2)
}
