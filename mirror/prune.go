package mirror

import (
	"context"
	"io"
	"strings"

	"github.com/opencontainers/go-digest"
)

// Prune deletes from the store every blob that no pinned reference needs: the pinned
// manifests, what they name, and for an index what its manifests name. pinned are the
// pinner's patterns (images stay in them for unpin_delay after their set goes, so their
// blobs are released when their pins are). Ingests no fill holds (what a kill -9 or a
// reboot left half written) go too. It returns how many blobs (and ingests) and bytes
// went.
func (m *Mirror) Prune(ctx context.Context, pinned []string) (int, int64, error) {
	return m.PruneKeeping(ctx, pinned, nil)
}

// PruneKeeping is Prune keeping also the blobs named in seeded (the manifests and blobs
// of seeds, package seed), even those the runtime's own content store holds: a seed is
// kept until it is removed.
func (m *Mirror) PruneKeeping(ctx context.Context, pinned []string, seeded []digest.Digest) (int, int64, error) {
	keepSeeded := make(map[digest.Digest]bool, len(seeded))
	for _, d := range seeded {
		keepSeeded[d] = true
	}
	keep := map[digest.Digest]bool{}
	var visit func(d digest.Digest)
	visit = func(d digest.Digest) {
		if keep[d] {
			return
		}
		keep[d] = true
		rd, _, _, err := m.storedReader(ctx, d)
		if err != nil {
			return // not stored (yet): nothing below it to keep
		}
		data, err := io.ReadAll(io.LimitReader(rd, 4<<20))
		rd.Close()
		if err != nil {
			return
		}
		blobs, manifests, ok := named(data)
		if !ok {
			return // a layer or a config: a leaf
		}
		for _, b := range blobs {
			keep[b.digest] = true
		}
		for _, c := range manifests {
			visit(c.digest)
		}
	}
	for _, p := range pinned {
		if strings.Contains(p, "*") {
			continue
		}
		if _, ref, ok := strings.Cut(p, "@"); ok {
			if d, err := digest.Parse(ref); err == nil {
				visit(d)
			}
		}
	}
	var gone []digest.Digest
	var freed int64
	if err := m.store.Walk(ctx, func(d digest.Digest, size int64) error {
		if keepSeeded[d] {
			return nil
		}
		// Not needed, or held by the runtime's own content store (no second copy),
		// unless the copy there was found corrupted.
		if !keep[d] || (m.also != nil && !m.isCorruptInRuntime(d) && m.also.Has(ctx, d)) {
			gone = append(gone, d)
			freed += size
		}
		return nil
	}); err != nil {
		return 0, 0, err
	}
	for _, d := range gone {
		if err := m.store.Delete(ctx, d); err != nil {
			return 0, 0, err
		}
	}
	// A fill holds its ingest through a live Writer: ReleaseIngests leaves those.
	ingests, ingestBytes, err := m.store.ReleaseIngests(ctx)
	if err != nil {
		return 0, 0, err
	}
	// A corrupted copy the runtime no longer holds (removed, or collected) is forgotten:
	// what it holds again is read again, and checked as it is.
	for _, d := range m.CorruptInRuntime() {
		if !m.also.Has(ctx, d) {
			m.mu.Lock()
			delete(m.corruptInRuntime, d)
			m.mu.Unlock()
		}
	}
	// What the mirror may serve shrinks with the pins too.
	m.mu.Lock()
	for repo, c := range m.children {
		for d := range c {
			if !keep[d] {
				delete(c, d)
			}
		}
		if len(c) == 0 {
			delete(m.children, repo)
		}
	}
	m.mu.Unlock()
	return len(gone) + ingests, freed + ingestBytes, nil
}
