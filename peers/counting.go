package peers

import (
	"context"
	"io"
	"sync"
	"sync/atomic"

	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/mirror"
)

// Stats are a node's blob and manifest bytes by where they came from or went.
type Stats struct {
	// FromRegistry: fetched from a registry (for this node or for a peer).
	FromRegistry atomic.Int64
	// FromPeers: read from other nodes.
	FromPeers atomic.Int64
	// ToPeers: served to other nodes.
	ToPeers atomic.Int64
	// Slow: requests to peers whose dial, handshake or answer took longer than its
	// bound, asked again (a slow peer is busy, not bad).
	Slow atomic.Int64

	// byImage are FromRegistry by pinned image ("repo@digest" of the pinned manifest
	// the bytes belong to).
	byImage sync.Map // string → *atomic.Int64
	// conns count what ended or broke the node's peer connections (ConnEvents).
	conns connEvents
}

// RegistryBytes are the bytes fetched from registries for the pinned image ref.
func (s *Stats) RegistryBytes(ref string) int64 {
	if v, ok := s.byImage.Load(ref); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

func (s *Stats) fromRegistry(repo string, chain []digest.Digest, d digest.Digest) *atomic.Int64 {
	root := d
	if len(chain) > 0 {
		root = chain[len(chain)-1]
	}
	v, _ := s.byImage.LoadOrStore(repo+"@"+root.String(), new(atomic.Int64))
	return v.(*atomic.Int64)
}

// CountRegistry counts in stats.FromRegistry what src (the registry) sends. It is the
// node's one way to the registry (for its own fetches, its peers' and their hops):
// its manifests are fetched once for every fetch wanting them at once (mirror.Shared).
func CountRegistry(src mirror.Source, stats *Stats) mirror.Source {
	return mirror.Shared(counted{src, stats})
}

type counted struct {
	mirror.Source
	stats *Stats
}

func (c counted) Manifest(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64) ([]byte, string, error) {
	data, mt, err := c.Source.Manifest(ctx, repo, chain, d, size)
	c.stats.FromRegistry.Add(int64(len(data)))
	c.stats.fromRegistry(repo, chain, d).Add(int64(len(data)))
	return data, mt, err
}

func (c counted) Blob(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64) (io.ReadCloser, int64, error) {
	rc, size, err := c.Source.Blob(ctx, repo, chain, d, size)
	if err != nil {
		return nil, 0, err
	}
	return &countingReader{rc, &c.stats.FromRegistry, c.stats.fromRegistry(repo, chain, d)}, size, nil
}

type countingReader struct {
	io.ReadCloser
	n, image *atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	c.image.Add(int64(n))
	return n, err
}
