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
// mirror.
type fakeContent struct {
	mu    sync.Mutex
	blobs map[digest.Digest][]byte
}

func (c *fakeContent) Reader(_ context.Context, d digest.Digest) (io.ReadSeekCloser, int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.blobs[d]
	if !ok {
		return nil, 0, errors.New("not found")
	}
	return nopSeekCloser{bytes.NewReader(b)}, int64(len(b)), nil
}

func (c *fakeContent) Has(_ context.Context, d digest.Digest) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.blobs[d]
	return ok
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
