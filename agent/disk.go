package agent

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/imagepin/imagepin/diskcheck"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/status"
)

// diskCheckTimeout bounds one disk check. It runs off the loop, so a registry that
// accepts connections and never answers delays only the pulls that wait for it.
const diskCheckTimeout = 2 * time.Minute

// checkDisk starts a disk check of the desired sets' missing images when what it would
// be asked changed or a retry is due (one at a time, off the loop), and returns the sets
// admitted so far. A set the check could not decide (a registry not answering) keeps its
// earlier verdict; when the check fails as a whole, every earlier verdict stands.
func (a *Agent) checkDisk(desired []pinset.Set) []pinset.Set {
	now := a.deps.Clock.Now()
	reqs := make([]diskcheck.SetRequest, 0, len(desired))
	for _, s := range desired {
		r := diskcheck.SetRequest{Name: s.Name}
		for _, ref := range s.Images {
			if img := a.pulls.images[ref]; img == nil || !img.present {
				r.Missing = append(r.Missing, ref)
				if img != nil && img.inflight && a.in.data.PulledEarly[ref] {
					r.Pulling = append(r.Pulling, ref)
				}
			} else {
				r.Present = append(r.Present, ref)
			}
		}
		reqs = append(reqs, r)
	}
	if a.disk.verdicts == nil {
		a.disk.verdicts = map[string]diskcheck.Verdict{}
	}
	if a.disk.running || (!a.disk.retry.scheduled(now) && !a.disk.changed(reqs)) {
		return a.disk.admitted(desired)
	}
	a.disk.running, a.disk.started = true, now
	a.disk.lastReqs = reqs
	mayPullEarly := a.mayPullEarly(reqs)
	a.background(diskCheckTimeout, func(ctx context.Context) func() {
		var early func(diskcheck.Early)
		if mayPullEarly {
			early = func(e diskcheck.Early) {
				select {
				case a.done <- func() { a.diskEarly(e) }:
				case <-ctx.Done():
				}
			}
		}
		res, err := a.deps.Disk.Check(ctx, reqs, early)
		return func() { a.diskChecked(reqs, res, err) }
	})
	return a.disk.admitted(desired)
}

// mayPullEarly says whether the check of reqs may let images be pulled before its
// verdict (diskcheck.Early): pins go in while it runs (Config.PinWhileChecking), no
// pull is in flight, and no set missing images holds a verdict that lets its pulls go
// on meanwhile: the check's room is then the early pulls' alone.
func (a *Agent) mayPullEarly(reqs []diskcheck.SetRequest) bool {
	if !a.cfg.PinWhileChecking || !a.cfg.PullEarly || a.pulls.inflight > 0 {
		return false
	}
	for _, r := range reqs {
		if len(r.Missing) > 0 && a.disk.verdicts[r.Name].Admitted {
			return false
		}
	}
	return true
}

// diskEarly takes what the check under way says may be pulled before its verdict, on
// the loop: those pulls start now (their pins are written while the check runs, see
// keepPinned), the rest at the verdict.
func (a *Agent) diskEarly(e diskcheck.Early) {
	if !a.disk.running {
		return
	}
	a.disk.early = e
	a.disk.earlyImages = make(map[string]bool, len(e.Images))
	for _, ref := range e.Images {
		a.disk.earlyImages[ref] = true
	}
	// The pull width starts from how far the registry is, as at a verdict; the sizes
	// let the first rounds be measured in bytes.
	a.pulls.width.Link(e.RoundTrip)
	a.observeWidth()
	a.recordSizes(e.Bytes)
	a.log.WithField("set", e.Set).WithField("images", len(e.Images)).
		Info("pulling images while the disk check sizes the set: their layers fit the room even at the most they could need")
}

// pullable are the sets pulls may start for: the admitted ones, and the set whose
// images the check under way lets be pulled before its verdict.
func (d *diskState) pullable(desired, admitted []pinset.Set) []pinset.Set {
	if d.early.Set == "" || slices.ContainsFunc(admitted, func(s pinset.Set) bool { return s.Name == d.early.Set }) {
		return admitted
	}
	for _, s := range desired {
		if s.Name == d.early.Set {
			return append(slices.Clip(admitted), s)
		}
	}
	return admitted
}

// pullAllowed says whether ref of set may be pulled now, and whether only as an early
// pull (before a verdict counting it), with the layers to order it by.
func (d *diskState) pullAllowed(set, ref string) (ok, early bool, layers []string) {
	if v := d.verdicts[set]; v.Admitted && d.sized[set][ref] {
		return true, false, v.Layers[ref]
	}
	if d.early.Set == set && d.earlyImages[ref] {
		return true, true, d.early.Layers[ref]
	}
	return false, false, nil
}

// diskChecked takes a disk check's answer to reqs, on the loop.
func (a *Agent) diskChecked(reqs []diskcheck.SetRequest, res diskcheck.Result, err error) {
	now := a.deps.Clock.Now()
	a.disk.running = false
	a.disk.early, a.disk.earlyImages = diskcheck.Early{}, nil
	a.disk.err = err
	if err != nil {
		a.log.WithError(err).Warn("disk check failed; keeping earlier verdicts")
		a.disk.retry.fail(now, a.cfg.MaxBackoff, a.rand)
		return
	}
	if res.Filesystem.Path != "" {
		a.disk.imageFS = res.Filesystem
	}
	// How far the registry is sets where the pull width starts.
	a.pulls.width.Link(res.RoundTrip)
	a.observeWidth()
	a.log.WithField("registry_round_trip", res.RoundTrip.String()).WithField("width", a.pulls.width.Width()).Debug("disk check done")
	retry := false
	verdicts := make(map[string]diskcheck.Verdict, len(res.Verdicts))
	for name, v := range res.Verdicts {
		undecided := !v.Admitted && v.Condition.Status == status.Unknown
		if undecided {
			if prev, ok := a.disk.verdicts[name]; ok && prev.Admitted {
				v.Admitted = true
			}
		}
		if prev, ok := a.disk.verdicts[name]; ok && prev.Admitted != v.Admitted {
			a.log.WithField("set", name).WithField("admitted", v.Admitted).Info(v.Condition.Message)
		} else if !ok && !v.Admitted {
			a.log.WithField("set", name).Warn(v.Condition.Message)
		} else if !ok {
			a.log.WithField("set", name).WithField("took", now.Sub(a.disk.started).Round(time.Millisecond).String()).
				WithField("registry_round_trip", res.RoundTrip.Round(100*time.Microsecond).String()).Info("disk check admitted the set: " + v.Condition.Message)
		}
		if !v.Admitted || undecided || len(v.Unavailable) > 0 || len(v.Unsized) > 0 {
			retry = true
		}
		a.recordSizes(v.Bytes)
		verdicts[name] = v
	}
	a.disk.verdicts = verdicts
	// A verdict admits the pulls of the images it was asked about, no others: an image a
	// set gained since waits for the check that counts it.
	a.disk.sized = map[string]map[string]bool{}
	for _, r := range reqs {
		m := make(map[string]bool, len(r.Missing))
		for _, ref := range r.Missing {
			m[ref] = true
		}
		a.disk.sized[r.Name] = m
	}
	if retry {
		a.disk.retry.fail(now, a.cfg.MaxBackoff, a.rand)
	} else {
		a.disk.retry.reset()
	}
}

// recordSizes keeps the images' compressed bytes the disk check sized (status, the pull
// width's rounds).
func (a *Agent) recordSizes(bytes map[string]uint64) {
	for image, b := range bytes {
		if a.in.data.Sizes[image] != b {
			if a.in.data.Sizes == nil {
				a.in.data.Sizes = map[string]uint64{}
			}
			a.in.data.Sizes[image] = b
			a.in.dataDirty = true
		}
	}
}

// recheckPinned makes the disk check due now when the last one could not size an image
// that pinned (the pins just written) now names: a pin can be what lets it be sized (the
// node-local mirror serves a pinned image's manifests from the node's store and its
// peers, with the registry gone), so a node joining with the registry gone sizes its
// sets right after its first pin write, not after the retry's backoff.
func (d *diskState) recheckPinned(pinned []string, now time.Time) {
	if d.running {
		return
	}
	for _, v := range d.verdicts {
		for ref := range v.Unsized {
			if slices.Contains(pinned, ref) {
				d.retry.dueAt(now)
				return
			}
		}
	}
}

// changed says whether the check must run again: a set came or went, or a set misses
// an image the last check was not asked about (a new image, one gone from the node). A
// set that only misses fewer (images landing as they are pulled) needs no new verdict:
// each check costs the runtime an ImageFsInfo and the registries their requests.
func (d *diskState) changed(reqs []diskcheck.SetRequest) bool {
	if len(reqs) != len(d.lastReqs) {
		return true
	}
	for i, r := range reqs {
		last := d.lastReqs[i]
		if r.Name != last.Name {
			return true
		}
		if len(r.Missing) > len(last.Missing) {
			return true
		}
		asked := make(map[string]bool, len(last.Missing))
		for _, ref := range last.Missing {
			asked[ref] = true
		}
		for _, ref := range r.Missing {
			if !asked[ref] {
				return true
			}
		}
	}
	return false
}

func (d *diskState) admitted(desired []pinset.Set) []pinset.Set {
	var out []pinset.Set
	for _, s := range desired {
		if v, ok := d.verdicts[s.Name]; ok && v.Admitted {
			out = append(out, s)
		}
	}
	return out
}

// diskPending says what a set not checked yet waits for.
func (a *Agent) diskPending() string {
	if a.disk.running {
		return fmt.Sprintf("sizing the missing images from their registries (running for %s)",
			a.deps.Clock.Now().Sub(a.disk.started).Round(time.Second))
	}
	return "not checked yet"
}
