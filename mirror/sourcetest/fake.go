package sourcetest

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/mirror"
)

// Fake is a mirror.Source from memory, keeping the contract Run checks: what a test
// needs as a blob source when the source itself is not under test. Its sender (Sends)
// is what it stands in front of, as a registry is for the real sources: the fake
// guards against it as they do (a wrong announced size refused, a stream bounded by
// the descriptor's size, cancellation).
type Fake struct {
	// Manifests is the origin's manifest d.
	Manifests func(ctx context.Context, d digest.Digest) (Manifest, error)
	// Sends is the origin's sender of blob d: a stream and the size it announces (-1:
	// none).
	Sends func(ctx context.Context, d digest.Digest) (io.ReadCloser, int64, error)
}

// NewFake is a Fake serving manifests and, honestly, blobs.
func NewFake(manifests map[digest.Digest]Manifest, blobs map[digest.Digest][]byte) *Fake {
	return &Fake{
		Manifests: func(_ context.Context, d digest.Digest) (Manifest, error) {
			m, ok := manifests[d]
			if !ok {
				return Manifest{}, fmt.Errorf("manifest %s: %w", d, ErrUnknown)
			}
			return m, nil
		},
		Sends: func(_ context.Context, d digest.Digest) (io.ReadCloser, int64, error) {
			b, ok := blobs[d]
			if !ok {
				return nil, 0, fmt.Errorf("blob %s: %w", d, ErrUnknown)
			}
			return io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
		},
	}
}

// FakeOf is a Fake in front of o (its manifests and its sender, sending as o does).
func FakeOf(o *Origin) *Fake { return &Fake{Manifests: o.Manifest, Sends: o.Send} }

func (f *Fake) Manifest(ctx context.Context, _ string, _ []digest.Digest, d digest.Digest, size int64) ([]byte, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	m, err := f.Manifests(ctx, d)
	if err != nil {
		return nil, "", err
	}
	if size >= 0 && int64(len(m.Data)) != size {
		return nil, "", fmt.Errorf("manifest %s: %d bytes, the index gives %d: %w", d, len(m.Data), size, mirror.ErrSize)
	}
	return m.Data, m.MediaType, nil
}

func (f *Fake) Blob(ctx context.Context, _ string, _ []digest.Digest, d digest.Digest, size int64) (io.ReadCloser, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	if size < 0 {
		return nil, 0, fmt.Errorf("%s: no size known: %w", d, mirror.ErrSize)
	}
	body, announced, err := f.Sends(ctx, d)
	if err != nil {
		return nil, 0, err
	}
	bounded, err := mirror.Bound(d, ctxReader{ctx, body}, announced, size, "sender")
	return bounded, announced, err
}

// ctxReader ends with ctx's error once ctx ends.
type ctxReader struct {
	ctx context.Context
	io.ReadCloser
}

func (r ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.ReadCloser.Read(p)
}
