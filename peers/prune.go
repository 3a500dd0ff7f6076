package peers

import (
	"context"
	"maps"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/seed"
)

// isPinned is what the mirror may serve: a manifest of a pinned reference.
func (n *Node) isPinned(repo string, d digest.Digest) bool {
	return (*n.pinned.Load())[repo+"@"+d.String()]
}

// setPinned takes the pinned references (the pinner's patterns: those with a wildcard
// name no manifest), waking the pruning when they changed.
func (n *Node) setPinned(refs []string) {
	m := map[string]bool{}
	for _, r := range refs {
		if !strings.Contains(r, "*") {
			m[r] = true
		}
	}
	old := n.pinned.Swap(&m)
	if !maps.Equal(*old, m) {
		n.wakePrune()
		n.keep.woken()
		n.held.woken()
	}
}

// wakePrune makes Run prune the store soon.
func (n *Node) wakePrune() {
	select {
	case n.prune <- struct{}{}:
	default:
	}
}

// settleAfterFill is how long after the last blob filled the store is pruned of what
// the runtime's own content store holds (the runtime has pulled it by then).
var settleAfterFill = 5 * time.Second

// Run prunes the store until ctx ends: the blobs no pinned reference needs go after
// each change of the pins (an image stays pinned for unpin_delay after its set goes:
// so do its blobs). With the runtime's own content store (Runtime.Content), what it
// holds goes too (no second copy at rest): looked at 5 s after the last blob filled,
// and every minute. First, the ingests no fill holds (what a kill -9 or a reboot left
// half written) go: a node that pins nothing after a restart never prunes. Beside the
// prune, the keeper puts in the store every blob of a pinned image that the node holds
// nowhere (keep.go), and what the node holds of its pinned images is read again after
// each keeper pass, each change of the pins and every 10 s (ImageBlobs, holdings.go).
func (n *Node) Run(ctx context.Context) error {
	n.releaseIngests(ctx)
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		n.keep.run(ctx)
	}()
	defer func() { <-kept }()
	read := make(chan struct{})
	go func() {
		defer close(read)
		seeds := &seededDigests{dir: n.cfg.SeedsDir}
		n.held.run(ctx, n.Holdings, seeds.read)
	}()
	defer func() { <-read }()
	var tick, settled <-chan time.Time
	if n.filled != nil {
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.filled:
			settled = time.After(settleAfterFill)
			continue
		case <-settled:
			settled = nil
		case <-n.prune:
		case <-tick:
		}
		n.pruneOnce(ctx)
	}
}

func (n *Node) pruneOnce(ctx context.Context) {
	var refs []string
	for r := range *n.pinned.Load() {
		refs = append(refs, r)
	}
	// What seeds put in the store stays until the seed is removed (imagepinctl seed
	// --remove); records that cannot be read keep everything: no prune.
	var seeded []digest.Digest
	if n.cfg.SeedsDir != "" {
		var err error
		if seeded, err = seed.Digests(n.cfg.SeedsDir); err != nil {
			n.log.WithError(err).Warn("mirror store: not pruned: the seed records cannot be read")
			return
		}
	}
	// An error with counts: pruned in part (what the runtime's content store, not
	// answering, may hold stays).
	count, freed, err := n.mirror.PruneKeeping(ctx, refs, seeded)
	if err != nil {
		n.log.WithError(err).Warn("mirror store: prune")
	}
	if count > 0 {
		n.log.WithField("blobs", count).WithField("bytes", freed).Info("mirror store: released the blobs of images no longer pinned, or held by the runtime's own content store")
	}
}

// releaseIngests drops the store's ingests no fill holds: at start, before any pin is
// known (a prune then would take every blob for unpinned), so only the half-written.
func (n *Node) releaseIngests(ctx context.Context) {
	count, freed, err := n.store.ReleaseIngests(ctx)
	switch {
	case err != nil:
		n.log.WithError(err).Warn("mirror store: releasing the blobs left half written")
	case count > 0:
		n.log.WithField("ingests", count).WithField("bytes", freed).Info("mirror store: released the blobs a stopped imagepind left half written")
	}
}
