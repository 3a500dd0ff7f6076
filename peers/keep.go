package peers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/mirror"
)

// keeper puts in the node's store every manifest and blob of every pinned image that
// the node holds nowhere: on CRI-O, a layer the runtime had already (pulled by the
// kubelet, or shared with another image) never comes through the mirror, and CRI-O
// keeps no compressed copy of it; on containerd, one its content store does not keep
// (discard_unpacked_layers). Each is asked through the mirror's own Source, as a pull
// through the mirror would be (the nodes up the blob's tree, then the registry: one
// copy from the registry for the cluster), and bounded by the size its manifest gives.
//
// It runs beside the pins, never before them: woken by a change of the pinned set, it
// waits keepSettle (the runtime's pulls, which fill the same blobs, go first and the
// keeper's requests join theirs), then goes over the pinned images. A pass that leaves
// a blob not held (the registry and the peers down, the store full) is tried again
// after keepRetry, twice as long each time up to keepRetryMax; a pass that leaves
// nothing is made again every keepEvery (a blob deleted as corrupted comes back). What
// it stores is pruned with the rest when its image is unpinned: it wakes the prune
// after each pass that stored anything, for an image unpinned meanwhile.
type keeper struct {
	mirror *mirror.Mirror
	// src is what the mirror fills from for the runtime (Bind); nil: not bound yet.
	src      mirror.Source
	instance mirror.Instance
	// pinned are the pinned references (repo@digest) now; isPinned whether one still is.
	pinned   func() []string
	isPinned func(repo string, d digest.Digest) bool
	// wake is signalled when the pinned set changed; pruneNow wakes the store's prune.
	wake     chan struct{}
	pruneNow func()
	// passed is called after each pass (nil: nothing): what the node holds is read
	// again.
	passed func()
	log    logrus.FieldLogger
}

// How the keeper paces itself (variables for tests).
var (
	keepSettle   = 10 * time.Second
	keepEvery    = 10 * time.Minute
	keepRetry    = 10 * time.Second
	keepRetryMax = 5 * time.Minute
)

// woken tells the keeper that the pinned set changed.
func (k *keeper) woken() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// run keeps the pinned images' blobs until ctx ends.
func (k *keeper) run(ctx context.Context) {
	timer := time.NewTimer(keepEvery)
	defer timer.Stop()
	var retry time.Duration
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.wake:
			timer.Reset(keepSettle)
			continue
		case <-timer.C:
		}
		err := k.pass(ctx)
		if k.passed != nil {
			k.passed()
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			retry = min(max(2*retry, keepRetry), keepRetryMax)
			k.log.WithError(err).WithField("retry_in", retry.String()).Warn("mirror store: blobs of pinned images the node holds nowhere could not be had; asked again later")
			timer.Reset(retry)
		default:
			retry = 0
			timer.Reset(keepEvery)
		}
	}
}

// pass goes once over the pinned images, putting in the store what the node holds
// nowhere. Its error counts the images left incomplete and names the first's cause.
func (k *keeper) pass(ctx context.Context) error {
	if k.src == nil {
		return nil
	}
	var kept mirror.Kept
	var failed []error
	for _, ref := range k.pinned() {
		repo, d, ok := splitRef(ref)
		if !ok || !k.isPinned(repo, d) {
			continue
		}
		got, err := k.mirror.Keep(ctx, repo, d, k.src, k.instance)
		kept.Blobs, kept.Bytes = kept.Blobs+got.Blobs, kept.Bytes+got.Bytes
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil && k.isPinned(repo, d) {
			failed = append(failed, fmt.Errorf("%s: %w", ref, err))
		}
	}
	if kept.Blobs > 0 {
		k.log.WithField("blobs", kept.Blobs).WithField("bytes", kept.Bytes).Info("mirror store: stored the blobs of pinned images the node held nowhere")
		k.pruneNow()
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d pinned image(s) not held whole; the first: %w", len(failed), failed[0])
	}
	return nil
}

// splitRef splits a pinned reference repo@digest; ok false for a pattern or a
// reference without a digest.
func splitRef(ref string) (repo string, d digest.Digest, ok bool) {
	repo, s, found := strings.Cut(ref, "@")
	if !found || strings.Contains(ref, "*") {
		return "", "", false
	}
	d, err := digest.Parse(s)
	return repo, d, err == nil
}

// pinnedRefs are the pinned references now, sorted (every node goes over them in the
// same order, so their requests for a blob meet down its tree).
func (n *Node) pinnedRefs() []string {
	var refs []string
	for r := range *n.pinned.Load() {
		refs = append(refs, r)
	}
	slices.Sort(refs)
	return refs
}

// ImageHolding is what the node holds of one image it pins.
type ImageHolding struct {
	// Image is the pinned reference, repo@digest.
	Image string
	mirror.Holding
	// Err says why what it holds cannot be told now (the runtime's content store not
	// answering); Holding is then what could be read.
	Err error
}

// Holdings are what the node holds of each image it pins, sorted by image: its
// manifests, config and layers (for an index, the instance of the node's platform),
// each said held when the node's store or the runtime's content store holds it. Read
// from those stores alone; nil on a nil Node ([peers] off).
func (n *Node) Holdings(ctx context.Context) []ImageHolding {
	if n == nil {
		return nil
	}
	var out []ImageHolding
	for _, ref := range n.pinnedRefs() {
		repo, d, ok := splitRef(ref)
		if !ok {
			continue
		}
		h, err := n.mirror.Holding(ctx, repo, d, n.keep.instance)
		out = append(out, ImageHolding{Image: ref, Holding: h, Err: err})
	}
	return out
}
