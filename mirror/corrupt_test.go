package mirror

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
)

// get is repo@d of kind ("manifests", "blobs") from the mirror at s: the body whole,
// or the error that cut it.
func (s served) get(kind string, d fmt.Stringer) ([]byte, int, error) {
	resp, err := http.Get(s.srv.URL + "/v2/" + repo + "/" + kind + "/" + d.String())
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return b, resp.StatusCode, err
}

// flipDigit changes one hex digit of data: a stored manifest corrupted on disk that is
// still a manifest (JSON of the same shape), under a digest it no longer matches.
func flipDigit(t *testing.T, data []byte) []byte {
	t.Helper()
	i := bytes.Index(data, []byte("sha256:"))
	if i < 0 {
		t.Fatal("no digest in the manifest")
	}
	out := bytes.Clone(data)
	i += len("sha256:")
	if out[i] == '0' {
		out[i] = '1'
	} else {
		out[i] = '0'
	}
	return out
}

// A stored manifest corrupted on disk (one hex digit flipped: still a manifest) is
// checked when served: it is not served, it leaves the store, and it is fetched again
// from the source, right, and stored right.
func TestACorruptedStoredManifestIsFetchedAgain(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	md := digest.Digest(d.String())
	s := serve(t, src, func(_ string, dd digest.Digest) bool { return dd == md })
	pullThrough(t, s.srv, repo, d)
	path := filepath.Join(s.dir, "blobs", "sha256", md.Encoded())
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, flipDigit(t, data), 0o644); err != nil {
		t.Fatal(err)
	}
	calls := src.calls.Load()
	b, status, err := s.get("manifests", md)
	if err != nil || status != http.StatusOK || digest.FromBytes(b) != md {
		t.Fatalf("a corrupted stored manifest: %d, %d bytes of digest %s, %v; want it fetched again, right", status, len(b), digest.FromBytes(b), err)
	}
	if src.calls.Load() != calls+1 {
		t.Fatalf("the source was asked %d times, want once", src.calls.Load()-calls)
	}
	if stored, err := os.ReadFile(path); err != nil || digest.FromBytes(stored) != md {
		t.Fatalf("the store holds %d bytes that do not match, %v; want the right copy", len(stored), err)
	}
	pullThrough(t, s.srv, repo, d)
}

// fakeContent is a runtime's content store in memory (containerd's), read-only to the
// mirror; down: it does not answer (containerd restarting), every call fails with it.
type fakeContent struct {
	mu    sync.Mutex
	blobs map[digest.Digest][]byte
	down  error
}

func (c *fakeContent) Reader(_ context.Context, d digest.Digest) (io.ReadSeekCloser, int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down != nil {
		return nil, 0, c.down
	}
	b, ok := c.blobs[d]
	if !ok {
		return nil, 0, fmt.Errorf("%s: %w", d, errdefs.ErrNotFound)
	}
	return nopSeekCloser{bytes.NewReader(b)}, int64(len(b)), nil
}

func (c *fakeContent) Has(_ context.Context, d digest.Digest) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down != nil {
		return false, c.down
	}
	_, ok := c.blobs[d]
	return ok, nil
}

func (c *fakeContent) setDown(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = err
}

func (c *fakeContent) put(d digest.Digest, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.blobs[d] = b
}

func (c *fakeContent) holds(d digest.Digest) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.blobs[d]
}

type nopSeekCloser struct{ *bytes.Reader }

func (nopSeekCloser) Close() error { return nil }

// On containerd the mirror serves the runtime's content store. A copy there corrupted
// on disk (a layer, and the manifest) is never served whole and never deleted (it is
// containerd's), and the request after it does not meet it again: the manifest is
// fetched from the source at once, the layer's first request is cut and the next one
// filled from the source into the mirror's own store, which keeps it (the prune drops a
// blob the runtime holds, but not one whose copy there is corrupted). It is named by
// CorruptInRuntime until the runtime no longer holds it.
func TestACorruptedCopyInTheRuntimesContentStore(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	md := digest.Digest(d.String())
	layers, _ := img.Layers()
	l0, _ := layers[0].Digest()
	ld := digest.Digest(l0.String())
	content := &fakeContent{blobs: map[digest.Digest][]byte{md: flipDigit(t, src.manifest)}}
	for bd, b := range src.blobs {
		content.blobs[bd] = b
	}
	bad := bytes.Clone(src.blobs[ld])
	bad[len(bad)/2] ^= 0xff
	content.blobs[ld] = bad
	s := serve(t, src, func(_ string, dd digest.Digest) bool { return dd == md })
	s.m.ReadAlso(content)
	ctx := context.Background()

	b, status, err := s.get("manifests", md)
	if err != nil || status != http.StatusOK || digest.FromBytes(b) != md {
		t.Fatalf("the manifest corrupted in the runtime's store: %d, %d bytes of digest %s, %v", status, len(b), digest.FromBytes(b), err)
	}
	if _, _, err := s.get("blobs", ld); err == nil {
		t.Fatal("a layer corrupted in the runtime's store was served whole")
	}
	calls := src.calls.Load()
	for i := range 2 {
		b, status, err := s.get("blobs", ld)
		if err != nil || status != http.StatusOK || !bytes.Equal(b, src.blobs[ld]) {
			t.Fatalf("request %d after the cut: %d, %d bytes, %v; want the layer, right", i+2, status, len(b), err)
		}
	}
	if src.calls.Load() != calls+1 {
		t.Fatalf("the source was asked %d times for the layer, want once", src.calls.Load()-calls)
	}
	if !bytes.Equal(content.holds(ld), bad) || !bytes.Equal(content.holds(md), flipDigit(t, src.manifest)) {
		t.Fatal("the runtime's content store was changed")
	}
	if got := s.m.CorruptInRuntime(); len(got) != 2 {
		t.Fatalf("CorruptInRuntime: %v, want the manifest and the layer", got)
	}
	pinned := []string{repo + "@" + md.String()}
	if _, _, err := s.m.Prune(ctx, pinned); err != nil {
		t.Fatal(err)
	}
	for _, kept := range []digest.Digest{md, ld} {
		if _, ok := s.store.Size(ctx, kept); !ok {
			t.Fatalf("%s left the mirror's store while the runtime's copy is corrupted", kept)
		}
	}
	if b, _, err := s.get("blobs", ld); err != nil || !bytes.Equal(b, src.blobs[ld]) {
		t.Fatalf("after the prune: %d bytes, %v", len(b), err)
	}
	// The runtime's corrupted copies gone (removed by the administrator): forgotten.
	content.mu.Lock()
	delete(content.blobs, ld)
	delete(content.blobs, md)
	content.mu.Unlock()
	if _, _, err := s.m.Prune(ctx, pinned); err != nil {
		t.Fatal(err)
	}
	if got := s.m.CorruptInRuntime(); len(got) != 0 {
		t.Fatalf("CorruptInRuntime after the runtime dropped them: %v", got)
	}
	pullThrough(t, s.srv, repo, d)
}

// manifestsSource serves manifests by digest (an index and its image), counting
// requests and noting the size each was asked with, and blobs as fakeSource does.
type manifestsSource struct {
	*fakeSource
	manifests map[digest.Digest][]byte
	mu        sync.Mutex
	sizes     map[digest.Digest]int64
}

func (s *manifestsSource) Manifest(_ context.Context, _ string, _ []digest.Digest, d digest.Digest, size int64) ([]byte, string, error) {
	s.mu.Lock()
	s.sizes[d] = size
	s.mu.Unlock()
	b, ok := s.manifests[d]
	if !ok {
		return nil, "", errors.New("manifest unknown")
	}
	return b, "", nil
}

// The index's size for its child manifest binds: the mirror asks its source for the
// child with that size (a peer then reads no more: package peers), and refuses a child
// of another size; a pinned manifest has no size (-1).
func TestAChildManifestIsBoundedByTheIndexsSize(t *testing.T) {
	img, fake := newImage(t)
	raw, _ := img.RawManifest()
	imd := digest.FromBytes(raw)
	index := []byte(fmt.Sprintf(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.docker.distribution.manifest.v2+json","digest":%q,"size":%d}]}`, imd, len(raw)))
	xd := digest.FromBytes(index)
	src := &manifestsSource{fakeSource: fake, manifests: map[digest.Digest][]byte{xd: index, imd: raw}, sizes: map[digest.Digest]int64{}}
	s := serve(t, src, func(_ string, dd digest.Digest) bool { return dd == xd })
	if b, status, err := s.get("manifests", xd); err != nil || status != http.StatusOK || !bytes.Equal(b, index) {
		t.Fatalf("the index: %d %v", status, err)
	}
	if b, status, err := s.get("manifests", imd); err != nil || status != http.StatusOK || !bytes.Equal(b, raw) {
		t.Fatalf("the child: %d %v", status, err)
	}
	if src.sizes[xd] != -1 || src.sizes[imd] != int64(len(raw)) {
		t.Fatalf("asked the source for the index with size %d, the child with %d; want -1 and %d", src.sizes[xd], src.sizes[imd], len(raw))
	}

	// An index giving its child another size than the child has: the child is refused
	// (404), though its digest is right, and not stored.
	lying := []byte(strings.Replace(string(index), fmt.Sprintf(`"size":%d`, len(raw)), fmt.Sprintf(`"size":%d`, len(raw)+1), 1))
	ld := digest.FromBytes(lying)
	src2 := &manifestsSource{fakeSource: fake, manifests: map[digest.Digest][]byte{ld: lying, imd: raw}, sizes: map[digest.Digest]int64{}}
	s2 := serve(t, src2, func(_ string, dd digest.Digest) bool { return dd == ld })
	if _, status, _ := s2.get("manifests", ld); status != http.StatusOK {
		t.Fatalf("the index: %d", status)
	}
	if _, status, _ := s2.get("manifests", imd); status != http.StatusNotFound {
		t.Fatalf("a child manifest of another size than the index gives: %d, want 404", status)
	}
	if _, ok := s2.store.Size(context.Background(), imd); ok {
		t.Fatal("stored")
	}
}

// corruptInRuntime is the mirror of TestACorruptedCopyInTheRuntimesContentStore after
// its first requests: the runtime's content store holding the image with its layer
// (ld) corrupted, and, when badManifest, its manifest (md) too; the layer's request
// after the cut filled into the mirror's own store.
func corruptInRuntime(t *testing.T, badManifest bool) (s served, content *fakeContent, src *fakeSource, md, ld digest.Digest, bad []byte) {
	t.Helper()
	img, src := newImage(t)
	d, _ := img.Digest()
	md = digest.Digest(d.String())
	layers, _ := img.Layers()
	l0, _ := layers[0].Digest()
	ld = digest.Digest(l0.String())
	content = &fakeContent{blobs: map[digest.Digest][]byte{md: src.manifest}}
	if badManifest {
		content.blobs[md] = flipDigit(t, src.manifest)
	}
	for bd, b := range src.blobs {
		content.blobs[bd] = b
	}
	bad = bytes.Clone(src.blobs[ld])
	bad[len(bad)/2] ^= 0xff
	content.blobs[ld] = bad
	s = serve(t, src, func(_ string, dd digest.Digest) bool { return dd == md })
	s.m.ReadAlso(content)
	s.get("manifests", md)
	if _, _, err := s.get("blobs", ld); err == nil {
		t.Fatal("a layer corrupted in the runtime's store was served whole")
	}
	if b, _, err := s.get("blobs", ld); err != nil || !bytes.Equal(b, src.blobs[ld]) {
		t.Fatalf("the layer after the cut: %d bytes, %v", len(b), err)
	}
	if _, ok := s.store.Size(context.Background(), ld); !ok {
		t.Fatal("the layer was not filled into the mirror's store")
	}
	return s, content, src, md, ld, bad
}

// A runtime's content store that does not answer for a prune or two (containerd
// restarting) is not taken for one that no longer holds what it held: the marks of
// its corrupted copies stay, and so do the mirror's own copies of them, while it is
// down and after; the prune says it kept what it could not tell.
func TestARuntimeContentStoreNotAnsweringClearsNoMark(t *testing.T) {
	s, content, src, md, ld, _ := corruptInRuntime(t, true)
	ctx := context.Background()
	pinned := []string{repo + "@" + md.String()}
	content.setDown(errors.New("rpc error: code = Unavailable desc = connection refused"))
	var errs [2]error
	for i := range errs {
		_, _, errs[i] = s.m.Prune(ctx, pinned)
	}
	content.setDown(nil)
	if _, _, err := s.m.Prune(ctx, pinned); err != nil {
		t.Fatal(err)
	}
	if got := s.m.CorruptInRuntime(); len(got) != 2 {
		t.Fatalf("CorruptInRuntime after the runtime's store came back: %v, want the manifest and the layer", got)
	}
	for _, kept := range []digest.Digest{md, ld} {
		if _, ok := s.store.Size(ctx, kept); !ok {
			t.Fatalf("%s left the mirror's store while the runtime's copy is corrupted", kept)
		}
	}
	calls := src.calls.Load()
	s.get("manifests", md)
	if b, status, err := s.get("blobs", ld); err != nil || status != http.StatusOK || !bytes.Equal(b, src.blobs[ld]) {
		t.Fatalf("the layer: %d, %d bytes, %v; want it right, from the mirror's store", status, len(b), err)
	}
	if src.calls.Load() != calls {
		t.Fatalf("the source was asked %d times, want none", src.calls.Load()-calls)
	}
	for i, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "does not answer") {
			t.Fatalf("prune %d with the runtime's store down: %v, want it said", i+1, err)
		}
	}
}

// A prune that cannot read a pinned manifest (held only by the runtime's content
// store, which does not answer) cannot tell what it names: it deletes nothing, the
// mirror's own copy of a layer corrupted in the runtime's store among what it keeps.
func TestAPruneThatCannotReadAPinnedManifestDeletesNothing(t *testing.T) {
	s, content, src, md, ld, _ := corruptInRuntime(t, false)
	ctx := context.Background()
	if _, ok := s.store.Size(ctx, md); ok {
		t.Fatal("the manifest is in the mirror's store: it is to be in the runtime's only")
	}
	pinned := []string{repo + "@" + md.String()}
	content.setDown(errors.New("rpc error: code = Unavailable desc = connection refused"))
	if n, _, err := s.m.Prune(ctx, pinned); err == nil || n != 0 {
		t.Fatalf("prune with the pinned manifest unreadable: %d released, %v; want none, and why", n, err)
	}
	if _, ok := s.store.Size(ctx, ld); !ok {
		t.Fatal("the mirror's own copy of a layer corrupted in the runtime's store was deleted")
	}
	content.setDown(nil)
	if _, _, err := s.m.Prune(ctx, pinned); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.store.Size(ctx, ld); !ok {
		t.Fatal("the mirror's own copy of a layer corrupted in the runtime's store was deleted")
	}
	if b, _, err := s.get("blobs", ld); err != nil || !bytes.Equal(b, src.blobs[ld]) {
		t.Fatalf("the layer: %d bytes, %v", len(b), err)
	}
}

// A corrupted copy the runtime holds right again (removed and pulled again between two
// prunes, so none saw it gone) is found so when read again (recheckCorruptEvery): the
// mark goes, the runtime's copy is served again, and the mirror's second copy goes. One
// still corrupted stays marked.
func TestACorruptedCopyPutBackRightIsFoundRight(t *testing.T) {
	old := recheckCorruptEvery
	recheckCorruptEvery = 0
	t.Cleanup(func() { recheckCorruptEvery = old })
	s, content, src, md, ld, _ := corruptInRuntime(t, false)
	ctx := context.Background()
	pinned := []string{repo + "@" + md.String()}
	if _, _, err := s.m.Prune(ctx, pinned); err != nil {
		t.Fatal(err)
	}
	if got := s.m.CorruptInRuntime(); len(got) != 1 || got[0] != ld {
		t.Fatalf("CorruptInRuntime with the copy still corrupted: %v, want %s", got, ld)
	}
	content.put(ld, src.blobs[ld])
	if _, _, err := s.m.Prune(ctx, pinned); err != nil {
		t.Fatal(err)
	}
	if got := s.m.CorruptInRuntime(); len(got) != 0 {
		t.Fatalf("CorruptInRuntime with the runtime's copy right again: %v", got)
	}
	if _, _, err := s.m.Prune(ctx, pinned); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.store.Size(ctx, ld); ok {
		t.Fatal("the mirror keeps a second copy of a layer the runtime holds right")
	}
	if b, _, err := s.get("blobs", ld); err != nil || !bytes.Equal(b, src.blobs[ld]) {
		t.Fatalf("the layer from the runtime's store: %d bytes, %v", len(b), err)
	}
}

// A manifest under a sha512 digest is checked with sha512: fetched from the source and
// served, and served from the runtime's content store, never taken for corrupted. (The
// mirror's store takes sha256 digests only: it is fetched again each time.)
func TestASha512ManifestIsCheckedWithSha512(t *testing.T) {
	img, fake := newImage(t)
	raw, _ := img.RawManifest()
	d := digest.SHA512.FromBytes(raw)
	src := &manifestsSource{fakeSource: fake, manifests: map[digest.Digest][]byte{d: raw}, sizes: map[digest.Digest]int64{}}
	s := serve(t, src, func(_ string, dd digest.Digest) bool { return dd == d })
	for i := range 2 {
		if b, status, err := s.get("manifests", d); err != nil || status != http.StatusOK || !bytes.Equal(b, raw) {
			t.Fatalf("request %d: %d, %d bytes, %v", i+1, status, len(b), err)
		}
	}

	content := &fakeContent{blobs: map[digest.Digest][]byte{d: raw}}
	src2 := &manifestsSource{fakeSource: fake, manifests: map[digest.Digest][]byte{}, sizes: map[digest.Digest]int64{}}
	s2 := serve(t, src2, func(_ string, dd digest.Digest) bool { return dd == d })
	s2.m.ReadAlso(content)
	if b, status, err := s2.get("manifests", d); err != nil || status != http.StatusOK || !bytes.Equal(b, raw) {
		t.Fatalf("from the runtime's store: %d, %d bytes, %v", status, len(b), err)
	}
	if got := s2.m.CorruptInRuntime(); len(got) != 0 {
		t.Fatalf("CorruptInRuntime: %v", got)
	}
}

// A manifest Shared keeps (or fetches for another caller at once) binds the size asked
// for as the source does: asked for with another size than it has, it is refused
// (ErrSize), not handed out because a caller asking with the right size (or none) got
// it a moment before.
func TestSharedBindsTheSizeOfAManifestItKeeps(t *testing.T) {
	img, fake := newImage(t)
	raw, _ := img.RawManifest()
	d := digest.FromBytes(raw)
	src := Shared(&manifestsSource{fakeSource: fake, manifests: map[digest.Digest][]byte{d: raw}, sizes: map[digest.Digest]int64{}})
	ctx := context.Background()
	n := int64(len(raw))
	for _, size := range []int64{-1, n} {
		if data, _, err := src.Manifest(ctx, repo, nil, d, size); err != nil || !bytes.Equal(data, raw) {
			t.Fatalf("asked with size %d: %d bytes, %v", size, len(data), err)
		}
		for _, other := range []int64{n - 1, n + 1} {
			if data, _, err := src.Manifest(ctx, repo, nil, d, other); !errors.Is(err, ErrSize) {
				t.Fatalf("a manifest of %d bytes, kept, asked for as %d: %d bytes, %v; want ErrSize", n, other, len(data), err)
			}
		}
	}
}
