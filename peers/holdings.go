package peers

import (
	"context"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/imagepin/imagepin/seed"
	"github.com/imagepin/imagepin/status"
)

// holdingsEvery is how often the node's holdings are read again from its stores besides
// after each keeper pass and each change of the pinned set (a fill by the runtime's
// pulls, a blob deleted as corrupted); a variable for tests.
var holdingsEvery = 10 * time.Second

// heldImage is what the node holds of one pinned image, as the agent and the held
// summary are told it: its blobs, and why they are not all known ("": they are).
type heldImage struct {
	blobs []status.Blob
	why   string
}

func (a heldImage) equal(b heldImage) bool {
	return a.why == b.why && slices.Equal(a.blobs, b.blobs)
}

// heldCache is the node's Holdings, read off the agent's loop (they read the stores:
// manifests and a stat a blob) and kept for ImageBlobs and the held summary. Run reads
// them again at its start, after each keeper pass, when the pinned set changed and
// every holdingsEvery, and calls onChange when they changed.
type heldCache struct {
	wake chan struct{}

	mu       sync.Mutex
	read     bool
	by       map[string]heldImage
	onChange func()
}

func newHeldCache() *heldCache {
	return &heldCache{wake: make(chan struct{}, 1)}
}

// woken makes run read the holdings again soon.
func (c *heldCache) woken() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run reads the holdings with read, and which of their blobs the node's complete seeds
// hold with seeded, until ctx ends.
func (c *heldCache) run(ctx context.Context, read func(context.Context) []ImageHolding, seeded func() map[string]bool) {
	t := time.NewTicker(holdingsEvery)
	defer t.Stop()
	for {
		c.update(read(ctx), seeded())
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		case <-t.C:
		}
	}
}

// update keeps hs, their blobs in seeded (digests) said Seeded, calling onChange when
// they differ from what was kept.
func (c *heldCache) update(hs []ImageHolding, seeded map[string]bool) {
	by := make(map[string]heldImage, len(hs))
	for _, h := range hs {
		by[h.Image] = heldOf(h, seeded)
	}
	c.mu.Lock()
	changed := !c.read || !maps.EqualFunc(c.by, by, heldImage.equal)
	c.read, c.by = true, by
	f := c.onChange
	c.mu.Unlock()
	if changed && f != nil {
		f()
	}
}

// heldOf is h as the agent is told it: a blob a complete seed holds (seeded) is Seeded;
// an image whose manifests are not all held, or whose holding cannot be read, has a why
// (its blobs are uncertain, not missing).
func heldOf(h ImageHolding, seeded map[string]bool) heldImage {
	out := heldImage{blobs: make([]status.Blob, 0, len(h.Blobs))}
	for _, b := range h.Blobs {
		d := b.Digest.String()
		// A manifest not held has no size the node knows (the mirror's -1): 0 in the
		// status, as reports carry sizes (the aggregator refuses a negative one).
		out.blobs = append(out.blobs, status.Blob{Digest: d, Size: max(b.Size, 0), Held: b.Held, Seeded: seeded[d]})
	}
	switch {
	case h.Err != nil:
		out.why = "what the node's store holds of it cannot be read: " + h.Err.Error()
	case !h.Complete:
		out.why = "a manifest of it is not in the node's store yet, so not all its blobs are known"
	}
	return out
}

// seededDigests are the manifests and blobs the node's complete seeds hold (seed.Held),
// read again when the records' directory changed or a minute passed. None while a record
// cannot be read (the node's status shows that as a fault): a blob counts for its seed's
// medium only when the seed says so.
type seededDigests struct {
	dir string // "": no seeds

	mtime time.Time
	at    time.Time
	set   map[string]bool
}

func (s *seededDigests) read() map[string]bool {
	if s.dir == "" {
		return nil
	}
	fi, err := os.Stat(s.dir)
	if err != nil {
		s.set = nil // no seed yet
		return nil
	}
	// A read within a second of the directory's change may have missed a change within
	// the same tick of its timestamp: read again next time.
	if s.at.IsZero() || !fi.ModTime().Equal(s.mtime) || s.at.Sub(s.mtime) < time.Second || time.Since(s.at) >= time.Minute {
		s.mtime, s.at = fi.ModTime(), time.Now()
		ds, err := seed.Held(s.dir)
		s.set = nil
		if err == nil {
			s.set = make(map[string]bool, len(ds))
			for _, d := range ds {
				s.set[d.String()] = true
			}
		}
	}
	return s.set
}

// image is what the node holds of image, from the last read.
func (c *heldCache) image(image string) ([]status.Blob, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.read {
		return nil, "the node's store has not been read yet"
	}
	h, ok := c.by[image]
	if !ok {
		return nil, "the node's mirror does not pin it yet"
	}
	return slices.Clone(h.blobs), h.why
}

// ImageBlobs says which blobs of the pinned image (repo@sha256:…) the node's stores
// hold and serve to peers, and which its complete seeds hold (agent.BlobHoldings), as
// last read (Run: after each keeper pass, each change of the pins, and every 10 s):
// not known, saying why, before the first read, for an image the mirror does not pin
// yet, and for one whose manifests are not all held or cannot be read.
func (n *Node) ImageBlobs(image string) ([]status.Blob, string) {
	return n.held.image(image)
}

// OnHoldings makes f be called, off the caller's loop, each time what the node holds of
// its pinned images changed (the agent's wake-up: its status reports them). A no-op on
// a nil Node.
func (n *Node) OnHoldings(f func()) {
	if n == nil {
		return
	}
	n.held.mu.Lock()
	n.held.onChange = f
	n.held.mu.Unlock()
}
