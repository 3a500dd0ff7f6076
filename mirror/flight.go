package mirror

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
)

// flights joins the calls for the same key made at once into one run of their fn. The
// run does not end with the caller that started it: it runs on a context no one caller
// cancels, each caller waits with its own context, and the run is cancelled only when
// every caller waiting on it has gone.
type flights[K comparable, V any] struct {
	mu sync.Mutex
	m  map[K]*flight[V]
}

type flight[V any] struct {
	done    chan struct{}
	v       V
	err     error
	waiters int // under flights.mu
	cancel  context.CancelFunc
}

func (g *flights[K, V]) do(ctx context.Context, key K, fn func(context.Context) (V, error)) (V, error) {
	g.mu.Lock()
	if g.m == nil {
		g.m = map[K]*flight[V]{}
	}
	f := g.m[key]
	if f == nil {
		fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		f = &flight[V]{done: make(chan struct{}), cancel: cancel}
		g.m[key] = f
		go func() {
			defer cancel()
			v, err := fn(fctx)
			g.mu.Lock()
			if g.m[key] == f {
				delete(g.m, key)
			}
			g.mu.Unlock()
			f.v, f.err = v, err
			close(f.done)
		}()
	}
	f.waiters++
	g.mu.Unlock()
	select {
	case <-f.done:
		return f.v, f.err
	case <-ctx.Done():
		g.mu.Lock()
		if f.waiters--; f.waiters == 0 {
			// Nobody waits: the run ends, and the next call starts another.
			f.cancel()
			if g.m[key] == f {
				delete(g.m, key)
			}
		}
		g.mu.Unlock()
		var zero V
		return zero, ctx.Err()
	}
}

// Shared is src with its manifests fetched once for every caller asking for the same
// one at once (a run no one caller cancels, as the mirror's own fetches), and each
// kept for sharedFor after: long enough for the mirror's fetch that wanted it to store
// it, so a fetch of the node's that missed the store a moment before does not fetch it
// again. Meant for the registry, which asks no peer: every fetch on a node may join
// its fetches without two nodes ever waiting on each other, so a manifest crosses the
// registry link once however many of the node's fetches (its own, its peers', their
// hops: each its own fetch in the mirror) want it.
func Shared(src Source) Source { return &shared{Source: src, recent: map[digest.Digest]kept{}} }

// sharedFor is how long Shared keeps a manifest it fetched.
var sharedFor = 10 * time.Second

type shared struct {
	Source
	// manifests are joined by digest and size: a caller asking with another size than
	// the manifest has gets ErrSize, not what a caller asking with the right one got.
	manifests flights[sizedDigest, manifest]

	mu     sync.Mutex
	recent map[digest.Digest]kept
}

type kept struct {
	manifest
	until time.Time
}

type sizedDigest struct {
	d    digest.Digest
	size int64
}

type manifest struct {
	data      []byte
	mediaType string
}

func (s *shared) Manifest(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64) ([]byte, string, error) {
	now := time.Now()
	s.mu.Lock()
	for k, v := range s.recent {
		if now.After(v.until) {
			delete(s.recent, k)
		}
	}
	k, ok := s.recent[d]
	s.mu.Unlock()
	if ok {
		// Kept from a fetch asked with another size, maybe (-1, or the right one).
		if size >= 0 && int64(len(k.data)) != size {
			return nil, "", fmt.Errorf("%s: %d bytes, the index naming it gives %d: %w", d, len(k.data), size, ErrSize)
		}
		return k.data, k.mediaType, nil
	}
	m, err := s.manifests.do(ctx, sizedDigest{d, size}, func(ctx context.Context) (manifest, error) {
		data, mt, err := s.Source.Manifest(ctx, repo, chain, d, size)
		if err == nil && Matches(data, d) {
			s.mu.Lock()
			s.recent[d] = kept{manifest{data, mt}, time.Now().Add(sharedFor)}
			s.mu.Unlock()
		}
		return manifest{data, mt}, err
	})
	return m.data, m.mediaType, err
}
