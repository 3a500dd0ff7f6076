package agent

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/failure"
	"github.com/imagepin/imagepin/pin"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/pullcreds"
)

// imageState is what the agent knows of one wanted image, shared by every set that
// lists it.
type imageState struct {
	wanted   bool
	checked  bool // present/pinned known since the last change that could alter them
	present  bool
	pinned   bool
	inflight bool
	retry    retry
	lastErr  error
	failure  failure.Class
	// layers are the image's layers as the verdict that let it be pulled named them;
	// claimed those its pull in flight fetches (pullState.fetching); holds says that
	// they are counted in pullState.held (pulled here, present since).
	layers  []string
	claimed []string
	holds   bool
}

type pullJob struct {
	image  string
	auth   *pullcreds.Auth
	gen    int        // the pin generation it was dispatched in
	pinner pin.Pinner // pins the image once pulled, where the runtime pins image records
	// byName: the runtime pins by name and was confirmed to have a pattern matching
	// this image when it was dispatched (CRI-O): a successful pull is present and
	// pinned, and needs no ImageStatus (the runtime's CPU is what loopback pulls wait on).
	byName bool
}

type pullResult struct {
	image string
	gen   int
	err   error
	took  time.Duration
	after cri.Image // ImageStatus after a successful pull
}

// refreshPresence asks the runtime about wanted images whose state is not known.
func (a *Agent) refreshPresence(ctx context.Context, desired []pinset.Set) {
	for _, img := range a.pulls.images {
		img.wanted = false
	}
	for _, s := range desired {
		for _, ref := range s.Images {
			img := a.pulls.images[ref]
			if img == nil {
				img = &imageState{retry: retry{key: pullKey(ref), sched: a.sched}}
				a.pulls.images[ref] = img
			}
			img.wanted = true
		}
	}
	for ref, img := range a.pulls.images {
		if !img.wanted && !img.inflight {
			a.pulls.unhold(img)
			delete(a.pulls.images, ref)
			a.sched.clear(pullKey(ref))
		}
	}
	if !a.rt.up() {
		return
	}
	again := false // an image to ask about again
	defer func() {
		if !again && a.rt.up() {
			a.pulls.recheck.reset()
		}
	}()
	var ask []string
	asked := map[string]bool{}
	for _, s := range desired {
		for _, ref := range s.Images {
			if img := a.pulls.images[ref]; !img.checked && !img.inflight && !asked[ref] {
				asked[ref] = true
				ask = append(ask, ref)
			}
		}
	}
	for i, st := range a.imageStatuses(ctx, ask) {
		ref, img, err := ask[i], a.pulls.images[ask[i]], st.err
		if err != nil {
			if isUnavailable(err) {
				a.runtimeDown(err)
				return
			}
			// Any other error: ask again later, and make sure a wake-up comes.
			a.log.WithError(err).WithField("image", ref).Warn("image status")
			a.scheduleRecheck()
			again = true
			continue
		}
		if img.present && !st.Present {
			a.log.WithField("image", ref).Warn("image is gone from the runtime's storage; pulling it again")
		}
		if !st.Present {
			// Its layers may be gone with it (a wiped storage): fetched again, in order.
			a.pulls.unhold(img)
		}
		if st.Present && !img.present {
			a.arrived(ref)
		}
		img.checked, img.present, img.pinned = true, st.Present, st.Pinned
		if a.staleUnpinned(ref, st.Image) {
			// The runtime's confirmed patterns match it, yet it says unpinned: its image
			// service may not have caught up yet. Ask again, with backoff.
			img.checked = false
			a.scheduleRecheck()
			again = true
		}
		if st.Present {
			img.lastErr = nil
			img.retry.reset()
		}
	}
}

type imageStatus struct {
	cri.Image
	err error
}

// statusWidth is how many ImageStatus calls run at once: a new set's images are asked
// about in a fraction of the time one after another takes.
const statusWidth = 8

// imageStatuses asks the runtime about refs, statusWidth at a time, each call with its
// deadline; the answers come in refs' order. A runtime that is down or hung stops the
// calls not made yet (they fail as it does): one deadline, not one per call.
func (a *Agent) imageStatuses(ctx context.Context, refs []string) []imageStatus {
	out := make([]imageStatus, len(refs))
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var wg sync.WaitGroup
	sem := make(chan struct{}, statusWidth)
	for i, ref := range refs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := context.Cause(ctx); err != nil {
				out[i] = imageStatus{err: err}
				return
			}
			cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
			defer cancel()
			st, err := a.deps.Runtime.ImageStatus(cctx, ref)
			if err != nil && isUnavailable(err) {
				stop(err)
			}
			out[i] = imageStatus{Image: st, err: err}
		}()
	}
	wg.Wait()
	return out
}

func pullKey(ref string) string { return "pull/" + ref }

// staleUnpinned says whether CRI-O calls a present image unpinned although the patterns
// it was confirmed to have match it.
func (a *Agent) staleUnpinned(ref string, st cri.Image) bool {
	return st.Present && !st.Pinned && a.pins.confirmedValid && a.rt.support.PinnedField && a.pins.effMatch.match(a.pins.effective, ref)
}

// scheduleRecheck makes sure a pass comes to ask about unchecked images again, with
// backoff while the reason persists.
func (a *Agent) scheduleRecheck() {
	if now := a.deps.Clock.Now(); a.pulls.recheck.due(now) {
		a.pulls.recheck.fail(now, a.cfg.MaxBackoff, a.rand)
	}
}

// dispatchPulls hands missing images of the admitted sets, in set name order, to the
// workers, as long as workers are free and each image's backoff has passed; with
// Config.OrderByLayers, an image waits while another pull fetches one of its layers
// (layers.go).
func (a *Agent) dispatchPulls(admitted []pinset.Set) {
	now := a.deps.Clock.Now()
	if !a.pulls.noSpaceTry.due(now) {
		return
	}
	// Between full passes the scan resumes where the last one stopped: what it passed
	// was started, present, or waiting, and the next full pass (which starts over) looks
	// at those again. A scan per pull result over the whole set was O(images) each.
	pos := 0
	for _, s := range admitted {
		for _, ref := range s.Images {
			if pos < a.pulls.dispatchFrom {
				pos++
				continue
			}
			pos++
			if a.pulls.inflight >= a.pulls.width.Width() {
				a.pulls.dispatchFrom = pos - 1
				return
			}
			img := a.pulls.images[ref]
			if img == nil || !img.checked || img.present || img.inflight || !img.retry.due(now) {
				continue
			}
			ok, early, layers := a.disk.pullAllowed(s.Name, ref)
			if !ok {
				// Missing since the last check: pull once a check has counted it (or
				// the check under way has let it be pulled before its verdict).
				continue
			}
			v := a.disk.verdicts[s.Name]
			if _, unavailable := v.Unavailable[ref]; unavailable {
				// The disk check found no endpoint serving it: pull when a later check does.
				continue
			}
			if _, unsized := v.Unsized[ref]; unsized {
				// Not counted in the need yet: pull once a later check has sized it.
				continue
			}
			if a.cfg.OrderByLayers {
				if p := a.pulls.blockedBy(layers); p != nil {
					// Another pull fetches one of its layers: start it when that pull
					// ends (the scan comes back here then).
					p.wait(pos - 1)
					continue
				}
				a.pulls.claim(img, ref, layers)
			}
			if early {
				a.markPulledEarly(ref, true)
			}
			img.inflight = true
			a.pulls.inflight++
			byName := a.pins.confirmedValid && a.rt.support.PinnedField && a.pins.effMatch.match(a.pins.effective, ref) && !a.pinsPerRecord()
			a.pulls.jobs <- pullJob{image: ref, auth: a.in.keyring.Lookup(ref), gen: a.pins.gen, pinner: a.rt.pinner, byName: byName}
		}
	}
	a.pulls.dispatchFrom = pos
	// Below the width with nothing more to start: this round measures the work left,
	// not the width.
	a.pulls.width.Unsaturated()
}

func (a *Agent) pullWorker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case job := <-a.pulls.jobs:
			start := time.Now()
			pctx, cancel := context.WithTimeout(ctx, a.cfg.PullTimeout)
			_, err := a.deps.Runtime.PullImage(pctx, job.image, job.auth)
			cancel()
			res := pullResult{image: job.image, gen: job.gen, err: err, took: time.Since(start)}
			if err == nil {
				res.after, res.err = a.afterPull(ctx, job)
			}
			select {
			case a.pulls.results <- res:
			case <-ctx.Done():
				return
			}
		}
	}
}

func (a *Agent) handleResult(r pullResult) {
	a.pulls.inflight--
	img := a.pulls.images[r.image]
	if img == nil {
		return
	}
	img.inflight = false
	a.pulls.release(img, r.err == nil)
	log := a.log.WithField("image", r.image).WithField("took", r.took.Round(time.Millisecond).String())
	now := a.deps.Clock.Now()
	defer a.observeWidth()
	if r.err == nil {
		a.pulls.width.Done(now, int64(a.in.data.Sizes[r.image]))
		a.deps.Observer.Pull("success", r.took)
		img.checked, img.present, img.pinned = true, true, r.after.Pinned
		img.lastErr = nil
		img.retry.reset()
		a.pulls.noSpaceTry.reset()
		log.WithField("pinned", r.after.Pinned).Info("pulled")
		a.arrived(r.image)
		if r.gen != a.pins.gen || a.staleUnpinned(r.image, r.after) {
			// The flag was read before the pins now confirmed (or before CRI-O's image
			// service caught up with them): ask again rather than trust it.
			img.checked = false
			a.scheduleRecheck()
		}
		return
	}
	img.lastErr = r.err
	img.failure = failure.Classify(r.err)
	a.deps.Observer.Pull(map[failure.Class]string{failure.Transient: "transient", failure.Unavailable: "unavailable", failure.NoSpace: "no_space"}[img.failure], r.took)
	img.retry.fail(now, a.cfg.MaxBackoff, a.rand)
	switch {
	case errors.Is(r.err, cri.ErrUnavailable):
		a.runtimeDown(r.err)
		img.checked = false
	case img.failure == failure.Transient:
		// The registry or the link is struggling: fewer pulls at once.
		a.pulls.width.Transient(now)
	case img.failure == failure.NoSpace:
		// Stop every pull at once: the others would fail the same way.
		a.pulls.noSpaceTry.fail(now, a.cfg.MaxBackoff, a.rand)
	}
	log.WithError(r.err).WithField("attempt", img.retry.attempts).Warn("pull failed")
}

// afterPull pins what the runtime pins per image record (containerd: at once, the same
// moment the pull returns) and reads the image's status, unless the label just set says
// it all.
func (a *Agent) afterPull(ctx context.Context, job pullJob) (cri.Image, error) {
	if job.byName {
		return cri.Image{Present: true, Pinned: true}, nil
	}
	pinned := false
	if job.pinner != nil {
		pctx, cancel := context.WithTimeout(ctx, rpcTimeout)
		var err error
		pinned, err = job.pinner.Pulled(pctx, job.image)
		cancel()
		if err != nil {
			// The next pass pins it (the image is present now); the status says so meanwhile.
			a.log.WithError(err).WithField("image", job.image).Warn("pin after pull")
		}
	}
	if pinned {
		// The record exists and carries the label: present and pinned. The CRI plugin
		// says so too once it has the image event; the next check of the image sees it.
		return cri.Image{Present: true, Pinned: true}, nil
	}
	sctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	st, err := a.deps.Runtime.ImageStatus(sctx, job.image)
	if err == nil && !st.Present {
		err = errors.New("the runtime reported the pull done but does not have the image")
	}
	return st, err
}

// observeWidth tells the observer (metrics) and the log when the pull width changed.
func (a *Agent) observeWidth() {
	if w := a.pulls.width.Width(); w != a.pulls.lastWidth {
		a.log.WithField("width", w).WithField("was", a.pulls.lastWidth).Debug("pull width")
		a.pulls.lastWidth = w
		a.deps.Observer.Width(w)
	}
}

// arrived tells the tags that image is on the node now: a tag waiting for its digest
// is made at once (a joining node's PinnedImagesReady waits for its tags).
func (a *Agent) arrived(image string) {
	if a.deps.Tags != nil {
		a.deps.Tags.Arrived(image)
	}
}

// SourcesChanged says where the images come from changed: peers the aggregator just
// named (a joining node learns them from its first reports, and with the registry gone
// they are its only source). Pulls that failed are tried again at once, not after their
// backoff. Safe to call from any goroutine; calls while one waits are one.
func (a *Agent) SourcesChanged() {
	select {
	case a.sourcesChanged <- struct{}{}:
	default:
	}
}

// retryFailedPulls, on the loop, makes every pull waiting out its backoff due now.
func (a *Agent) retryFailedPulls() {
	now := a.deps.Clock.Now()
	n := 0
	for _, img := range a.pulls.images {
		if img.lastErr != nil && !img.inflight && !img.present && !img.retry.due(now) {
			img.retry.dueAt(now)
			n++
		}
	}
	if n > 0 {
		a.log.WithField("images", n).Info("image sources changed (peers): failed pulls tried again now")
	}
}
