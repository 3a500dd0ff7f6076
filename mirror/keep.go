package mirror

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/blobstore"
)

// Instance picks, from an index (a manifest list), the manifest the node's runtime
// pulls: registry.Instance for the node's platform.
type Instance func(index []byte) (digest.Digest, error)

// Kept is what one Keep added to the store.
type Kept struct {
	// Blobs are the manifests and blobs the store did not hold before and holds now;
	// Bytes their size.
	Blobs int
	Bytes int64
}

// keepParallel bounds the blobs of one image Keep fetches at once.
const keepParallel = 3

// Keep makes the node hold the pinned image repo@d: its manifest; for an index, the
// manifest instance picks (the one the runtime pulls); and that manifest's config and
// layers. What the store (or the runtime's content store) holds is left as it is;
// the rest is fetched through src as a pull through the mirror is (one fill per blob,
// joined with any request for it, bounded by the size its manifest gives, checked
// against its digest, committed), and put in the store. Keep returns once every blob
// is held or has failed: the error names each one that failed (a source down, a
// manifest giving no size, the store full); what was stored stays.
func (m *Mirror) Keep(ctx context.Context, repo string, d digest.Digest, src Source, instance Instance) (Kept, error) {
	var kept Kept
	if !m.pinned(repo, d) {
		return kept, fmt.Errorf("%s@%s: not pinned", repo, d)
	}
	data, err := m.keepManifest(ctx, repo, nil, d, src, &kept)
	if err != nil {
		return kept, err
	}
	blobs, manifests, _ := named(data)
	if len(manifests) > 0 {
		inst, err := instance(data)
		if err != nil {
			return kept, fmt.Errorf("index %s: %w", d, err)
		}
		if data, err = m.keepManifest(ctx, repo, []digest.Digest{d}, inst, src, &kept); err != nil {
			return kept, err
		}
		blobs, _, _ = named(data)
	}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	sem := make(chan struct{}, keepParallel)
	for _, b := range blobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			stored, err := m.keepBlob(ctx, repo, b.digest, src)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("blob %s: %w", b.digest, err))
			} else if stored {
				kept.Blobs++
				kept.Bytes += b.size
			}
		}()
	}
	wg.Wait()
	return kept, errors.Join(errs...)
}

// keepManifest is the manifest repo@d (chain: the manifests above it), read from the
// store or the runtime's content store, else fetched through src, and put in the store
// when neither holds it.
func (m *Mirror) keepManifest(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, src Source, kept *Kept) ([]byte, error) {
	before, err := m.holds(ctx, d)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", d, err)
	}
	data, _, err := m.loadManifest(ctx, repo, chain, d, src)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", d, err)
	}
	if before {
		return data, nil
	}
	if _, ok := m.store.Size(ctx, d); !ok {
		// Fetched, but the fetch's own write did not take it (a full disk, a fill of
		// the same digest ending).
		sw, err := m.store.Writer(ctx, d, int64(len(data)))
		if errors.Is(err, blobstore.ErrExists) {
			err = nil
		} else if err == nil {
			if _, err = sw.Write(data); err == nil {
				err = sw.Commit(ctx)
			}
			if err != nil {
				sw.Abandon(context.WithoutCancel(ctx), nil)
			} else {
				sw.Close()
			}
		}
		if err != nil {
			return nil, fmt.Errorf("manifest %s: the store cannot take it: %w", d, err)
		}
	}
	kept.Blobs++
	kept.Bytes += int64(len(data))
	return data, nil
}

// keepBlob fetches blob d of repo into the store unless the node holds it; stored
// says it was fetched.
func (m *Mirror) keepBlob(ctx context.Context, repo string, d digest.Digest, src Source) (stored bool, err error) {
	held, err := m.holds(ctx, d)
	if err != nil || held {
		return false, err
	}
	c, ok := m.child(repo, d)
	switch {
	case !ok:
		// Its manifest was pruned from what the mirror serves meanwhile (unpinned).
		return false, errors.New("no pinned manifest names it now")
	case c.size < 0:
		return false, errors.New("the manifest naming it gives no size: not fetched (nothing would bound it)")
	}
	if err := m.fetchBlob(ctx, repo, m.Chain(repo, d), d, c.size, src); err != nil {
		return false, err
	}
	return true, nil
}

// errStoreFull is a blob Keep does not fetch while the store cannot take blobs: a
// stream that is not stored would cost the source a copy for nothing.
var errStoreFull = errors.New("the blob store could not take a blob less than a minute ago (a full disk?)")

// fetchBlob fills blob d of size bytes into the store from src, or joins the fill
// under way, and waits until it is committed or has failed.
func (m *Mirror) fetchBlob(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64, src Source) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return errClosed
	}
	f := m.fills[d]
	if f == nil {
		if time.Since(m.storeFailed) < time.Minute {
			m.mu.Unlock()
			return errStoreFull
		}
		var err error
		f, err = m.startFill(ctx, repo, chain, d, size, src)
		if errors.Is(err, blobstore.ErrExists) {
			m.mu.Unlock()
			return nil
		}
		if err != nil {
			m.mu.Unlock()
			return fmt.Errorf("blob store: %w", err)
		}
	}
	m.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { f.update(func() {}) })
	defer stop()
	f.mu.Lock()
	defer f.mu.Unlock()
	for !f.done && ctx.Err() == nil {
		f.cond.Wait()
	}
	if !f.done {
		return ctx.Err()
	}
	return f.err
}

// holds says whether the node holds d: in the store, or in the runtime's content
// store (a copy there found corrupted does not count); an error when the runtime's
// content store does not answer.
func (m *Mirror) holds(ctx context.Context, d digest.Digest) (bool, error) {
	if _, ok := m.store.Size(ctx, d); ok {
		return true, nil
	}
	if m.also == nil || m.isCorruptInRuntime(d) {
		return false, nil
	}
	held, err := m.also.Has(ctx, d)
	if err != nil {
		return false, fmt.Errorf("the runtime's content store does not answer: %w", err)
	}
	return held, nil
}

// Holding is what the node holds of a pinned image, read from the store and the
// runtime's content store alone (no source is asked).
type Holding struct {
	// Blobs are the image's manifests (the pinned one first; for an index, then the
	// instance the runtime pulls), config and layers, each once.
	Blobs []HeldBlob
	// Complete: every manifest is held, so Blobs names every blob of the image; else
	// what a manifest not held names is not known (and not listed).
	Complete bool
}

// Missing are the blobs of h the node does not hold.
func (h Holding) Missing() []HeldBlob {
	var out []HeldBlob
	for _, b := range h.Blobs {
		if !b.Held {
			out = append(out, b)
		}
	}
	return out
}

// HeldBlob is one manifest or blob of an image.
type HeldBlob struct {
	Digest digest.Digest
	// Size is the descriptor's (a pinned manifest: its own, when held; -1: unknown).
	Size int64
	// Held: the store, or the runtime's content store, holds it.
	Held bool
}

// Holding is what the node holds of the pinned image repo@d (instance: see Keep). An
// error when it cannot be told: the runtime's content store does not answer, or a
// held manifest cannot be read or is corrupted on disk.
func (m *Mirror) Holding(ctx context.Context, repo string, d digest.Digest, instance Instance) (Holding, error) {
	var h Holding
	data, err := m.heldManifest(ctx, d, -1, &h)
	if err != nil || data == nil {
		return h, err
	}
	blobs, manifests, _ := named(data)
	if len(manifests) > 0 {
		inst, err := instance(data)
		if err != nil {
			return h, fmt.Errorf("index %s: %w", d, err)
		}
		size := int64(-1)
		for _, c := range manifests {
			if c.digest == inst {
				size = c.size
			}
		}
		if data, err = m.heldManifest(ctx, inst, size, &h); err != nil || data == nil {
			return h, err
		}
		blobs, _, _ = named(data)
	}
	seen := map[digest.Digest]bool{}
	for _, b := range blobs {
		if seen[b.digest] {
			continue
		}
		seen[b.digest] = true
		held, err := m.holds(ctx, b.digest)
		if err != nil {
			return h, fmt.Errorf("blob %s: %w", b.digest, err)
		}
		h.Blobs = append(h.Blobs, HeldBlob{Digest: b.digest, Size: b.size, Held: held})
	}
	h.Complete = true
	return h, nil
}

// heldManifest adds manifest d (of size bytes, -1: unknown) to h and reads it when the
// node holds it (nil when not).
func (m *Mirror) heldManifest(ctx context.Context, d digest.Digest, size int64, h *Holding) ([]byte, error) {
	held, err := m.holds(ctx, d)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", d, err)
	}
	if !held {
		h.Blobs = append(h.Blobs, HeldBlob{Digest: d, Size: size, Held: false})
		return nil, nil
	}
	data, err := m.storedManifest(ctx, d, size)
	if err != nil {
		if errdefs.IsNotFound(err) || errors.Is(err, errNotStored) || errors.Is(err, errCorrupt) {
			// Gone since (a prune), or found corrupted (deleted from the store, or read
			// no more from the runtime's): not held.
			h.Blobs = append(h.Blobs, HeldBlob{Digest: d, Size: size, Held: false})
			return nil, nil
		}
		return nil, fmt.Errorf("manifest %s: %w", d, err)
	}
	h.Blobs = append(h.Blobs, HeldBlob{Digest: d, Size: int64(len(data)), Held: true})
	return data, nil
}
