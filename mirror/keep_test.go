package mirror

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/opencontainers/go-digest"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/pullcreds"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/test/registrytest"
)

// amd64 is the instance Keep's tests choose of an index.
func amd64(index []byte) (digest.Digest, error) {
	return registry.Instance(index, registry.Platform{OS: "linux", Architecture: "amd64"})
}

// put writes b into the store as d.
func put(t *testing.T, store *blobstore.Store, d digest.Digest, b []byte) {
	t.Helper()
	ctx := context.Background()
	w, err := store.Writer(ctx, d, int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// blobsOf are an image's config and layer digests (fakeSource.blobs' keys), sorted.
func blobsOf(src *fakeSource) []digest.Digest {
	var out []digest.Digest
	for d := range src.blobs {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

// getFrom is repo@d of kind from the mirror at s, as get.
func (s served) getFrom(repo, kind string, d digest.Digest) ([]byte, int, error) {
	resp, err := http.Get(s.srv.URL + "/v2/" + PathFor(repo) + "/" + kind + "/" + d.String())
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return b, resp.StatusCode, err
}

// The node had some of a pinned image already (a layer in its store, one in the
// runtime's content store, as containerd holds what it pulled) and nothing pulls it:
// Keep stores the manifest, the config and the layer held nowhere, asks the source for
// those alone, and leaves the runtime's copy where it is. Holding then says every blob
// is held; a second Keep asks nothing.
func TestKeepStoresWhatTheNodeHoldsNowhere(t *testing.T) {
	img, src := newImage(t)
	d := digest.Digest(must(img.Digest()).String())
	s := serve(t, src, func(r string, dd digest.Digest) bool { return r == repo && dd == d })
	ctx := context.Background()
	layers, _ := img.Layers()
	inStore := digest.Digest(must(layers[0].Digest()).String())
	inRuntime := digest.Digest(must(layers[1].Digest()).String())
	put(t, s.store, inStore, src.blobs[inStore])
	content := &fakeContent{blobs: map[digest.Digest][]byte{inRuntime: src.blobs[inRuntime]}}
	s.m.ReadAlso(content)

	kept, err := s.m.Keep(ctx, repo, d, src, amd64)
	if err != nil {
		t.Fatal(err)
	}
	// The manifest, the config and the third layer.
	if got := src.calls.Load(); got != 3 || kept.Blobs != 3 {
		t.Fatalf("source asked %d times, %d kept; want 3 and 3 (manifest, config, the layer held nowhere)", got, kept.Blobs)
	}
	for _, b := range append(blobsOf(src), d) {
		_, stored := s.store.Size(ctx, b)
		if stored == (b == inRuntime) {
			t.Errorf("%s in the store: %v (the runtime's content store holds it: %v)", b, stored, b == inRuntime)
		}
	}
	h, err := s.m.Holding(ctx, repo, d, amd64)
	if err != nil || !h.Complete || len(h.Blobs) != 5 || len(h.Missing()) != 0 {
		t.Fatalf("holding %+v %v; want 5 blobs, all held", h, err)
	}
	if h.Blobs[0].Digest != d {
		t.Fatalf("the pinned manifest is not first: %+v", h.Blobs)
	}
	if kept, err := s.m.Keep(ctx, repo, d, src, amd64); err != nil || kept.Blobs != 0 || src.calls.Load() != 3 {
		t.Fatalf("a second Keep: %+v %v, source asked %d times in all", kept, err, src.calls.Load())
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// Of an index, Keep stores the instance the node's platform pulls, and no other; what
// the node holds says the same.
func TestKeepStoresThePlatformsInstanceOfAnIndex(t *testing.T) {
	imgA, fakeA := newImage(t)
	imgB, fakeB := newImage(t)
	rawA, _ := imgA.RawManifest()
	rawB, _ := imgB.RawManifest()
	da, db := digest.FromBytes(rawA), digest.FromBytes(rawB)
	index := []byte(fmt.Sprintf(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[`+
		`{"mediaType":"application/vnd.docker.distribution.manifest.v2+json","digest":%q,"size":%d,"platform":{"os":"linux","architecture":"arm64"}},`+
		`{"mediaType":"application/vnd.docker.distribution.manifest.v2+json","digest":%q,"size":%d,"platform":{"os":"linux","architecture":"amd64"}}]}`,
		db, len(rawB), da, len(rawA)))
	xd := digest.FromBytes(index)
	for d, b := range fakeB.blobs {
		fakeA.blobs[d] = b
	}
	src := &manifestsSource{fakeSource: fakeA, manifests: map[digest.Digest][]byte{xd: index, da: rawA, db: rawB}, sizes: map[digest.Digest]int64{}}
	s := serve(t, src, func(_ string, d digest.Digest) bool { return d == xd })
	ctx := context.Background()

	h, err := s.m.Holding(ctx, repo, xd, amd64)
	if err != nil || h.Complete || len(h.Blobs) != 1 || h.Blobs[0].Held {
		t.Fatalf("holding before: %+v %v; want the index alone, not held, incomplete", h, err)
	}
	if _, err := s.m.Keep(ctx, repo, xd, src, amd64); err != nil {
		t.Fatal(err)
	}
	for _, d := range []digest.Digest{xd, da} {
		if _, ok := s.store.Size(ctx, d); !ok {
			t.Errorf("manifest %s not stored", d)
		}
	}
	if _, ok := s.store.Size(ctx, db); ok {
		t.Error("the arm64 instance's manifest was stored on an amd64 node")
	}
	layersB, _ := imgB.Layers()
	for _, l := range layersB {
		if _, ok := s.store.Size(ctx, digest.Digest(must(l.Digest()).String())); ok {
			t.Error("an arm64 layer was stored on an amd64 node")
		}
	}
	h, err = s.m.Holding(ctx, repo, xd, amd64)
	if err != nil || !h.Complete || len(h.Blobs) != 2+len(fakeA.blobs)-len(fakeB.blobs) || len(h.Missing()) != 0 {
		t.Fatalf("holding after: %+v %v", h, err)
	}
	if h.Blobs[0].Digest != xd || h.Blobs[1].Digest != da || h.Blobs[1].Size != int64(len(rawA)) {
		t.Fatalf("holding after: the index then its amd64 instance first: %+v", h.Blobs)
	}
}

// downSource is a source that fails every request while down.
type downSource struct {
	Source
	down atomic.Bool
}

func (s *downSource) Manifest(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64) ([]byte, string, error) {
	if s.down.Load() {
		return nil, "", errors.New("connection refused")
	}
	return s.Source.Manifest(ctx, repo, chain, d, size)
}

func (s *downSource) Blob(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64) (io.ReadCloser, int64, error) {
	if s.down.Load() {
		return nil, 0, errors.New("connection refused")
	}
	return s.Source.Blob(ctx, repo, chain, d, size)
}

// With the source down, Keep says which blobs it could not have and stores nothing of
// them; once it is back, the next Keep has them all.
func TestKeepAgainOnceTheSourceIsBack(t *testing.T) {
	img, fake := newImage(t)
	d := digest.Digest(must(img.Digest()).String())
	src := &downSource{Source: fake}
	s := serve(t, src, func(r string, dd digest.Digest) bool { return r == repo && dd == d })
	ctx := context.Background()
	if _, err := s.m.Keep(ctx, repo, d, src, amd64); err != nil {
		t.Fatal(err)
	}
	layers, _ := img.Layers()
	ld := digest.Digest(must(layers[2].Digest()).String())
	if err := s.store.Delete(ctx, ld); err != nil { // found corrupted, say
		t.Fatal(err)
	}
	src.down.Store(true)
	_, err := s.m.Keep(ctx, repo, d, src, amd64)
	if err == nil || !strings.Contains(err.Error(), ld.String()) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Keep with the source down: %v; want an error naming %s", err, ld)
	}
	if h, _ := s.m.Holding(ctx, repo, d, amd64); len(h.Missing()) != 1 || h.Missing()[0].Digest != ld {
		t.Fatalf("missing %+v, want %s", h.Missing(), ld)
	}
	src.down.Store(false)
	if kept, err := s.m.Keep(ctx, repo, d, src, amd64); err != nil || kept.Blobs != 1 {
		t.Fatalf("Keep with the source back: %+v %v", kept, err)
	}
}

// Keep is bounded as a fill is: a source sending more than the manifest gives is cut
// at that size and nothing is stored; a blob without a size is not fetched.
func TestKeepIsBoundedByTheManifestsSizes(t *testing.T) {
	img, src := newImage(t)
	d := digest.Digest(must(img.Digest()).String())
	src.tail = 8 << 20
	s := serve(t, src, func(r string, dd digest.Digest) bool { return r == repo && dd == d })
	ctx := context.Background()
	_, err := s.m.Keep(ctx, repo, d, src, amd64)
	if !errors.Is(err, ErrSize) {
		t.Fatalf("Keep from a source sending more: %v, want ErrSize", err)
	}
	for _, b := range blobsOf(src) {
		if _, ok := s.store.Size(ctx, b); ok {
			t.Errorf("%s stored", b)
		}
	}
	if n := src.read.Load(); n > 4*(1<<20) {
		t.Fatalf("%d bytes read from the source", n)
	}
}

// A pull and Keep asking for the same blobs at once share one transfer each.
func TestKeepJoinsThePullsFills(t *testing.T) {
	img, fake := newImage(t)
	d := digest.Digest(must(img.Digest()).String())
	src := slowSource{fake}
	s := serve(t, src, func(r string, dd digest.Digest) bool { return r == repo && dd == d })
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := s.m.Keep(context.Background(), repo, d, src, amd64); err != nil {
			t.Error(err)
		}
	}()
	pullThrough(t, s.srv, repo, d)
	wg.Wait()
	if got := fake.calls.Load(); got != 5 {
		t.Fatalf("the source was asked %d times for a manifest and 4 blobs", got)
	}
}

// Through the node's real registry access (containers/image, a TLS registry with a
// pull secret): a release v2 sharing its base layer with v1, which the runtime pulled
// itself (the store holds nothing of it); v2's own layer came through the mirror. Keep
// of both pinned images stores every manifest and blob of each, the shared layer once;
// of a multi-platform index, the node's instance only.
func TestKeepThroughTheNodesRegistryAccess(t *testing.T) {
	reg := registrytest.New(t, map[string]string{"shop": "puller:ppass"})
	base := registrytest.RandomLayer(t, 300<<10)
	v1img := registrytest.Image(t, base, registrytest.RandomLayer(t, 100<<10))
	v2img := registrytest.Image(t, base, registrytest.RandomLayer(t, 120<<10))
	arm := registrytest.Image(t, registrytest.RandomLayer(t, 50<<10))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: v2img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}})
	ref1 := reg.Push("shop/app", v1img, "puller:ppass")
	ref2 := reg.PushIndex("shop/app", idx, "puller:ppass")
	f := registrytest.NewFiles(t, "")
	reg.WriteCA(f.Certs)
	auth := &pullcreds.Auth{Username: "puller", Password: "ppass"}
	source := FromRegistry(registry.New(registry.Config{RegistriesConf: f.Conf, RegistriesConfDir: f.ConfDir, CertsDir: f.Certs},
		func(string) *pullcreds.Auth { return auth }))
	app := reg.Host + "/shop/app"
	d1 := digest.Digest(strings.TrimPrefix(ref1, "shop/app@"))
	d2 := digest.Digest(strings.TrimPrefix(ref2, "shop/app@"))
	s := serve(t, source, func(r string, d digest.Digest) bool { return r == app && (d == d1 || d == d2) })
	ctx := context.Background()

	// v2's own layer through the mirror, as CRI-O pulls what it lacks.
	v2raw, _ := v2img.RawManifest()
	v2d := digest.FromBytes(v2raw)
	for _, md := range []digest.Digest{d2, v2d} {
		if _, status, err := s.getFrom(app, "manifests", md); err != nil || status != 200 {
			t.Fatalf("manifest %s: %d %v", md, status, err)
		}
	}
	v2layers, _ := v2img.Layers()
	own := digest.Digest(must(v2layers[1].Digest()).String())
	if _, status, err := s.getFrom(app, "blobs", own); err != nil || status != 200 {
		t.Fatalf("v2's own layer: %d %v", status, err)
	}
	for _, ref := range []digest.Digest{d1, d2} {
		h, err := s.m.Holding(ctx, app, ref, amd64)
		if err != nil {
			t.Fatal(err)
		}
		if ref == d1 && (h.Complete || len(h.Missing()) != 1) {
			t.Fatalf("v1 before: %+v; want nothing held (its manifest not read)", h)
		}
		if ref == d2 && (!h.Complete || len(h.Missing()) != 2) { // v2's config and the base
			t.Fatalf("v2 before: %+v; want its config and base missing", h)
		}
	}

	for _, ref := range []digest.Digest{d1, d2} {
		if _, err := s.m.Keep(ctx, app, ref, source, amd64); err != nil {
			t.Fatalf("keep %s: %v", ref, err)
		}
		h, err := s.m.Holding(ctx, app, ref, amd64)
		if err != nil || !h.Complete || len(h.Missing()) != 0 {
			t.Fatalf("%s after: %+v %v", ref, h, err)
		}
	}
	armRaw, _ := arm.RawManifest()
	if _, ok := s.store.Size(ctx, digest.FromBytes(armRaw)); ok {
		t.Fatal("the arm64 instance was kept on an amd64 node")
	}
	used, _ := s.store.Usage(ctx)
	want := int64(registrytest.LayerBytes(t, base, must(v1img.Layers())[1], v2layers[1]))
	if used < want || used > want+64<<10 {
		t.Fatalf("the store holds %d bytes; the three distinct layers are %d (and a few KiB of manifests and configs)", used, want)
	}
}
