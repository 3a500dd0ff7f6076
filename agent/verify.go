package agent

import (
	"context"
)

// verifyKey is the schedule's entry for the next presence verification.
const verifyKey = "verify"

// verifyPresence lists the runtime's images (one ListImages, off the loop) every
// VerifyEvery and marks each image held present that the runtime no longer names for a
// fresh look: ImageStatus then decides, and a missing image goes back to Pulling. A
// false alarm costs one ImageStatus; nothing is unpinned for it. containerd also sends
// events; CRI-O sends none, so this is how CRI-O nodes see an image removed behind
// imagepind's back.
func (a *Agent) verifyPresence() {
	now := a.deps.Clock.Now()
	if a.pulls.verifying || !a.rt.up() {
		return
	}
	at, ok := a.sched.when(verifyKey)
	if !ok {
		// The first pass looks at every image anyway (ImageStatus): start the clock.
		a.sched.set(verifyKey, now.Add(a.cfg.VerifyEvery))
		return
	}
	if now.Before(at) {
		return
	}
	a.pulls.verifying = true
	a.sched.clear(verifyKey)
	a.background(rpcTimeout, func(ctx context.Context) func() {
		names, err := a.deps.Runtime.ImageNames(ctx)
		return func() { a.verified(names, err) }
	})
}

// verified takes a ListImages answer, on the loop.
func (a *Agent) verified(names map[string]string, err error) {
	a.pulls.verifying = false
	a.sched.set(verifyKey, nextLook(&a.lookAgain.verify, a.deps.Clock.Now(), a.cfg.VerifyEvery))
	if err != nil {
		a.log.WithError(err).Debug("presence verification: list images")
		return
	}
	for ref, img := range a.pulls.images {
		if !img.wanted || !img.present || !img.checked || img.inflight || names[ref] != "" {
			continue
		}
		img.checked = false
		a.log.WithField("image", ref).Warn("a pinned image is no longer listed by the runtime (removed behind imagepind's back?): looking again, and pulling it if it is gone")
	}
}
