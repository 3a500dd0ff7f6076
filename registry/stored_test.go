package registry

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/opencontainers/go-digest"
)

// mapStore is a node's store in memory.
type mapStore map[digest.Digest][]byte

func (s mapStore) Reader(_ context.Context, d digest.Digest) (io.ReadSeekCloser, int64, error) {
	b, ok := s[d]
	if !ok {
		return nil, 0, io.ErrUnexpectedEOF
	}
	return nopSeekCloser{bytes.NewReader(b)}, int64(len(b)), nil
}

type nopSeekCloser struct{ *bytes.Reader }

func (nopSeekCloser) Close() error { return nil }

func (s mapStore) putImage(t *testing.T, img v1.Image, layers bool) {
	t.Helper()
	raw, _ := img.RawManifest()
	s[digest.FromBytes(raw)] = raw
	cfg, _ := img.RawConfigFile()
	s[digest.FromBytes(cfg)] = cfg
	if !layers {
		return
	}
	ls, _ := img.Layers()
	for _, l := range ls {
		rc, _ := l.Compressed()
		b, _ := io.ReadAll(rc)
		s[digest.FromBytes(b)] = b
	}
}

// An image by digest whose manifests the node's store holds is sized from them, with
// no registry at all (its host does not resolve): layers, sizes, and each layer's
// uncompressed size from the stored layer; a list resolves to the platform's instance.
// What the store lacks, or a tag, is left to the registry.
func TestResolveStored(t *testing.T) {
	ctx := context.Background()
	f := newFiles(t, "")
	r := resolver(f, Platform{OS: "linux", Architecture: "amd64"}, nil)
	l1, l2 := layer(t, 3000), layer(t, 5000)
	img := image(t, l1, l2)
	d, _ := img.Digest()
	store := mapStore{}
	store.putImage(t, img, true)
	const repo = "seeded.example.invalid/app"

	got, stored, err := r.ResolveStored(ctx, store, repo+"@"+d.String())
	if err != nil || !stored {
		t.Fatalf("stored %v, %v", stored, err)
	}
	if len(got.Layers) != 2 {
		t.Fatalf("layers %+v", got.Layers)
	}
	for i, l := range []v1.Layer{l1, l2} {
		ld, _ := l.Digest()
		size, _ := l.Size()
		usize := uncompressedLen(t, l)
		if g := got.Layers[i]; g.Digest != ld.String() || g.Size != size || g.Uncompressed != usize || g.From != FromGzipTrailer {
			t.Fatalf("layer %d: %+v, want %s %d bytes, %d uncompressed", i, g, ld, size, usize)
		}
	}
	if n := r.RangeRequests(); n != 0 {
		t.Fatalf("%d Range requests for a stored image", n)
	}

	// Its layers not stored: sized all the same, their uncompressed sizes unknown.
	bare := image(t, layer(t, 2000))
	bd, _ := bare.Digest()
	store.putImage(t, bare, false)
	if got, stored, err := r.ResolveStored(ctx, store, repo+"@"+bd.String()); err != nil || !stored || len(got.Layers) != 1 || got.Layers[0].Uncompressed != 0 {
		t.Fatalf("layers not stored: %+v %v %v", got, stored, err)
	}

	// A list: the instance for the platform.
	amd, arm := image(t, layer(t, 1000)), image(t, layer(t, 4000))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	raw, _ := idx.RawManifest()
	store[digest.FromBytes(raw)] = raw
	store.putImage(t, amd, true)
	ref := repo + "@" + digest.FromBytes(raw).String()
	got, stored, err = r.ResolveStored(ctx, store, ref)
	amdLayers, _ := amd.Layers()
	want, _ := amdLayers[0].Digest()
	if err != nil || !stored || len(got.Layers) != 1 || got.Layers[0].Digest != want.String() {
		t.Fatalf("list: %+v %v %v", got, stored, err)
	}
	// The platform's instance not stored (only arm64's would be): the registry's to say.
	arm64 := resolver(f, Platform{OS: "linux", Architecture: "arm64"}, nil)
	if _, stored, err := arm64.ResolveStored(ctx, store, ref); stored || err != nil {
		t.Fatalf("instance not stored: %v %v", stored, err)
	}
	// No instance for the platform at all: the stored list says so, as the registry would.
	s390 := resolver(f, Platform{OS: "linux", Architecture: "s390x"}, nil)
	if _, stored, err := s390.ResolveStored(ctx, store, ref); !stored || !IsUnavailable(err) || !strings.Contains(err.Error(), "no image found in") {
		t.Fatalf("s390x: %v %v", stored, err)
	}

	// Not in the store, a tag, a name that does not parse: the registry's.
	for _, ref := range []string{repo + "@sha256:" + strings.Repeat("0", 64), repo + ":v1", "Not A Name"} {
		if _, stored, err := r.ResolveStored(ctx, store, ref); stored || err != nil {
			t.Fatalf("%s: %v %v", ref, stored, err)
		}
	}
}

func uncompressedLen(t *testing.T, l v1.Layer) int64 {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	n, err := io.Copy(io.Discard, rc)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
