package mirror

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
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
//
// What it cannot tell it keeps. A pinned manifest that cannot be read (held only by the
// runtime's content store, which does not answer) hides what it names: nothing is
// deleted, and the error says why. A blob the runtime's content store may hold, but
// does not answer for, stays in the store; so does a mark of a corrupted copy there
// (CorruptInRuntime): the counts are returned with an error saying so.
func (m *Mirror) PruneKeeping(ctx context.Context, pinned []string, seeded []digest.Digest) (int, int64, error) {
	keepSeeded := make(map[digest.Digest]bool, len(seeded))
	for _, d := range seeded {
		keepSeeded[d] = true
	}
	keep := map[digest.Digest]bool{}
	var unread error
	var visit func(d digest.Digest)
	visit = func(d digest.Digest) {
		if keep[d] {
			return
		}
		keep[d] = true
		rd, _, _, err := m.storedReader(ctx, d)
		if errdefs.IsNotFound(err) {
			return // not stored (yet): nothing below it to keep
		}
		if err != nil {
			unread = fmt.Errorf("%s: %w", d, err)
			return
		}
		data, err := io.ReadAll(io.LimitReader(rd, 4<<20))
		rd.Close()
		if err != nil {
			unread = fmt.Errorf("%s: %w", d, err)
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
	if unread != nil {
		return 0, 0, fmt.Errorf("nothing pruned: a pinned manifest cannot be read, and what it names is kept: %w", unread)
	}
	// runtimeErr is the runtime's content store not answering: what it may hold is kept.
	var runtimeErr error
	heldByRuntime := func(d digest.Digest) bool {
		if m.also == nil || runtimeErr != nil || m.isCorruptInRuntime(d) {
			return false
		}
		held, err := m.also.Has(ctx, d)
		if err != nil {
			runtimeErr = fmt.Errorf("the runtime's content store does not answer (%s): the blobs it may hold are kept: %w", d, err)
		}
		return held && err == nil
	}
	var gone []digest.Digest
	var freed int64
	if err := m.store.Walk(ctx, func(d digest.Digest, size int64) error {
		if keepSeeded[d] {
			return nil
		}
		// Not needed, or held by the runtime's own content store (no second copy),
		// unless the copy there was found corrupted.
		if !keep[d] || heldByRuntime(d) {
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
	if runtimeErr == nil {
		runtimeErr = m.recheckCorrupt(ctx)
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
	return len(gone) + ingests, freed + ingestBytes, runtimeErr
}

// recheckCorruptEvery is how often a copy in the runtime's content store found
// corrupted is read again while the runtime holds it: one removed and put back (pulled
// again) between two prunes is found right, and read again, within that.
var recheckCorruptEvery = 5 * time.Minute

// recheckCorrupt goes over the copies in the runtime's content store found corrupted
// (CorruptInRuntime): one the runtime no longer holds (removed, or collected) is
// forgotten, and what it holds again is read again, and checked as it is; one it still
// holds is read and checked again every recheckCorruptEvery, and forgotten once it
// matches. A mark is kept while the runtime's store does not answer (the error).
func (m *Mirror) recheckCorrupt(ctx context.Context) error {
	if m.also == nil {
		return nil
	}
	m.mu.Lock()
	marks := maps.Clone(m.corruptInRuntime)
	m.mu.Unlock()
	for _, d := range slices.Sorted(maps.Keys(marks)) {
		held, err := m.also.Has(ctx, d)
		if err != nil {
			return fmt.Errorf("the runtime's content store does not answer (%s): its copies found corrupted stay marked: %w", d, err)
		}
		if held {
			if time.Since(marks[d]) < recheckCorruptEvery {
				continue
			}
			ok, err := m.runtimeCopyMatches(ctx, d)
			switch {
			case errdefs.IsNotFound(err): // removed meanwhile: forgotten
			case err != nil:
				return fmt.Errorf("reading the runtime's copy of %s, found corrupted: it stays marked: %w", d, err)
			case !ok:
				m.mu.Lock()
				if _, marked := m.corruptInRuntime[d]; marked {
					m.corruptInRuntime[d] = time.Now()
				}
				m.mu.Unlock()
				continue
			default:
				m.log.WithField("digest", d).Info("mirror: the runtime's content store holds a copy that matches its digest again: read from it again")
			}
		}
		m.mu.Lock()
		delete(m.corruptInRuntime, d)
		m.mu.Unlock()
	}
	return nil
}

// runtimeCopyMatches reads the runtime's copy of d whole and says whether it matches d.
func (m *Mirror) runtimeCopyMatches(ctx context.Context, d digest.Digest) (bool, error) {
	rd, _, err := m.also.Reader(ctx, d)
	if err != nil {
		return false, err
	}
	defer rd.Close()
	v := d.Verifier()
	if _, err := io.Copy(v, rd); err != nil {
		return false, err
	}
	return v.Verified(), nil
}
