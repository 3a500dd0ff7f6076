package mirror

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"

	"github.com/opencontainers/go-digest"
)

// oneManifest serves one manifest, of any size asked (as a registry does), and counts.
type oneManifest struct {
	data  []byte
	asked atomic.Int64
}

func (o *oneManifest) Manifest(_ context.Context, _ string, _ []digest.Digest, d digest.Digest, _ int64) ([]byte, string, error) {
	o.asked.Add(1)
	return o.data, "application/vnd.oci.image.manifest.v1+json", nil
}

func (o *oneManifest) Blob(context.Context, string, []digest.Digest, digest.Digest, int64) (io.ReadCloser, int64, error) {
	return nil, 0, errors.New("no blobs")
}

// Shared keeps a manifest it fetched for the next callers, who may each ask another
// size (a pinned manifest none, an index's child the index's): each caller's size binds
// what it gets, whoever fetched it (before, a manifest kept from a caller asking none
// went to a caller asking one byte more, unchecked).
func TestSharedChecksEachCallersSize(t *testing.T) {
	o := &oneManifest{data: []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"}`)}
	d, n := digest.FromBytes(o.data), int64(len(o.data))
	s := Shared(o)
	if data, _, err := s.Manifest(t.Context(), "r", nil, d, -1); err != nil || len(data) != len(o.data) {
		t.Fatalf("any size: %d bytes, %v", len(data), err)
	}
	for _, size := range []int64{n - 1, n + 1} {
		if data, _, err := s.Manifest(t.Context(), "r", nil, d, size); !errors.Is(err, ErrSize) {
			t.Errorf("asked for %d bytes of a %d-byte manifest kept: %d bytes, %v; want ErrSize", size, n, len(data), err)
		}
	}
	if data, _, err := s.Manifest(t.Context(), "r", nil, d, n); err != nil || int64(len(data)) != n {
		t.Fatalf("its own size: %d bytes, %v", len(data), err)
	}
	if got := o.asked.Load(); got != 1 {
		t.Fatalf("the source was asked %d times; want once (kept)", got)
	}
}
