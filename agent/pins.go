package agent

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/imagepin/imagepin/pin"
	"github.com/imagepin/imagepin/pinset"
)

// syncPins makes the managed drop-in hold the pins the desired sets keep (keepPinned),
// the images of sets that left less than unpin_delay ago, and the other config files'
// patterns; reloads CRI-O when that changes what CRI-O should have; and confirms CRI-O
// has it.
func (a *Agent) syncPins(ctx context.Context, desired, admitted []pinset.Set) {
	now := a.deps.Clock.Now()
	a.pins.faults = nil

	wanted, unchecked := a.keepPinned(desired, admitted)
	if a.deps.Tags != nil {
		tags, conflicts := pinset.TagsOf(desired)
		a.deps.Tags.Want(tags)
		a.pins.faults = append(a.pins.faults, conflicts...)
	}
	for img := range wanted {
		if released, ok := a.in.data.Pins[img]; !ok || !released.IsZero() {
			a.setPin(img, time.Time{})
		}
		a.markUnchecked(img, unchecked[img])
		if !unchecked[img] {
			a.markPulledEarly(img, false) // a verdict counts it now
		}
	}
	for img, released := range a.in.data.Pins {
		switch {
		case wanted[img]:
		case a.in.data.Unchecked[img] && (!a.present(img) || a.in.data.PulledEarly[img]):
			// Pinned while the check ran, and the node does not hold it (or holds it
			// only because it was pulled before the verdict): nothing to keep.
			delete(a.in.data.Pins, img)
			a.markUnchecked(img, false)
			a.sched.clear(unpinKey(img))
			a.in.dataDirty = true
			a.log.WithField("image", img).Info("unpinning an image pinned while the disk check ran: its set was refused (or left), and the node did not hold it before")
		case released.IsZero():
			a.markUnchecked(img, false)
			a.setPin(img, now)
			a.log.WithField("image", img).WithField("unpin_in", a.cfg.UnpinDelay.String()).Info("image no longer wanted; keeping its pin for unpin_delay")
		case now.Sub(released) >= a.cfg.UnpinDelay:
			delete(a.in.data.Pins, img)
			a.markUnchecked(img, false)
			a.sched.clear(unpinKey(img))
			a.in.dataDirty = true
			a.log.WithField("image", img).Info("unpinning image")
		}
	}

	// After the unpins: an image pulled early of a set that just left loses its pin at
	// once above, then its mark.
	a.forgetPulledEarly(desired)

	if a.rt.pinner == nil {
		// The runtime is not known yet (auto): nothing can be written; the pins wait.
		return
	}
	patterns := make([]string, 0, len(a.in.data.Pins))
	for img := range a.in.data.Pins {
		patterns = append(patterns, img)
	}
	sort.Strings(patterns)
	images := func(ref string) (bool, bool) {
		img := a.pulls.images[ref]
		return img != nil && img.present, img != nil && img.pinned
	}
	// Bounded as a whole: containerd's label calls have a deadline each, and a runtime
	// that does not answer ends the write at its first one.
	wctx, cancel := context.WithTimeout(ctx, pinWriteTimeout)
	w, err := a.rt.pinner.Write(wctx, patterns, images)
	cancel()
	a.pins.faults = append(a.pins.faults, w.Faults...)
	if err != nil {
		a.log.WithError(err).Error("write pins")
		a.pins.retry.fail(now, a.cfg.MaxBackoff, a.rand)
		return
	}
	if w.Changed {
		a.log.WithField("where", a.rt.pinner.Describe()).WithField("patterns", len(patterns)).Info("pins written")
	}
	for _, ref := range w.Recheck {
		if img := a.pulls.images[ref]; img != nil && !img.inflight {
			a.log.WithField("image", ref).Info("the runtime changed the image behind imagepind's back (label dropped by a pull, record deleted); looking again")
			img.checked = false
		}
	}
	a.pins.effective = w.Effective
	if !slices.Equal(w.Overriders, a.pins.overriders) && len(w.Overriders) > 0 {
		a.log.WithField("files", strings.Join(w.Overriders, ",")).Warn("a CRI-O config file read after ours sets pinned_images and overrides our pins")
	}
	a.pins.overriders = w.Overriders

	if w.Changed {
		a.pins.confirmedValid = false
		a.pins.retry.reset()
		a.disk.recheckPinned(patterns, now)
	}
	if a.pins.confirmedValid && sameSet(a.pins.confirmed, a.pins.effective) {
		return
	}
	a.pins.confirmedValid = false
	if !a.rt.up() || !a.rt.support.WithoutRestart {
		// Nothing to apply (the runtime is down), or it would not help (too old): the
		// runtime reads the pins when it starts.
		return
	}
	if !a.pins.retry.due(now) {
		return
	}
	if err := a.applyAndConfirm(ctx, w.Changed); err != nil {
		a.deps.Observer.Reload("failed")
		a.pins.faults = append(a.pins.faults, err.Error())
		a.log.WithError(err).Warn("pins not confirmed; retrying")
		a.pins.retry.fail(a.deps.Clock.Now(), a.cfg.MaxBackoff, a.rand)
		return
	}
	a.deps.Observer.Reload("confirmed")
	a.pins.retry.reset()
}

// setPin records a pin: wanted (released zero), or released at that time, its unpin on
// the schedule.
func (a *Agent) setPin(img string, released time.Time) {
	a.in.data.Pins[img] = released
	a.in.dataDirty = true
	if released.IsZero() {
		a.sched.clear(unpinKey(img))
	} else {
		a.sched.set(unpinKey(img), released.Add(a.cfg.UnpinDelay))
	}
}

func unpinKey(img string) string { return "unpin/" + img }

// keepPinned is what the desired sets pin. Keeping a pin is separate from being allowed
// to pull: the images an admitted set's verdict counted, and of every desired set the
// images that are present or already pinned, whatever the disk check says (or before it has
// answered). The check gates only new pulls, and pins of images not on the node yet: a
// node under disk pressure, a registry that does not answer, or a restart must never
// unpin what a set still wants, least of all while the kubelet's image GC is deleting.
//
// With Config.PinWhileChecking, an image of a set the check has not judged yet (a new
// set, or an image an admitted set gained), or that the check under way lets be pulled
// before its verdict (a set refused before, checked again), is pinned too, as
// unchecked: only while nothing else keeps it, and its pin goes at once when a verdict
// refuses the set (or the set leaves) and the node does not hold the image, or holds it
// only for having pulled it early (state.Data.PulledEarly).
func (a *Agent) keepPinned(desired, admitted []pinset.Set) (wanted, unchecked map[string]bool) {
	may := make(map[string]bool, len(admitted))
	for _, s := range admitted {
		may[s.Name] = true
	}
	wanted, unchecked = map[string]bool{}, map[string]bool{}
	for _, s := range desired {
		v, judged := a.disk.verdicts[s.Name]
		for _, ref := range s.Images {
			_, pinned := a.in.data.Pins[ref]
			sized := a.disk.sized[s.Name][ref]
			switch {
			// An admitted set's image on the node is a checked pin, pulled early or not:
			// the verdict counted it (in its need, or on the disk it measured).
			case (may[s.Name] && (sized || a.present(ref))) || (pinned && !a.in.data.Unchecked[ref]) || (a.present(ref) && !a.in.data.PulledEarly[ref]):
				wanted[ref] = true
				delete(unchecked, ref)
			case wanted[ref]:
			case a.cfg.PinWhileChecking && (!judged || (v.Admitted && !sized) || (a.disk.early.Set == s.Name && a.disk.earlyImages[ref])):
				wanted[ref], unchecked[ref] = true, true
			}
		}
	}
	return wanted, unchecked
}

// present says whether the runtime holds ref, as last looked.
func (a *Agent) present(ref string) bool {
	img := a.pulls.images[ref]
	return img != nil && img.present
}

// markUnchecked records whether img's pin is unchecked (keepPinned).
func (a *Agent) markUnchecked(img string, unchecked bool) {
	a.mark(&a.in.data.Unchecked, img, unchecked)
}

// markPulledEarly records whether img was pulled before the verdict of the check that
// counts it (state.Data.PulledEarly).
func (a *Agent) markPulledEarly(img string, early bool) { a.mark(&a.in.data.PulledEarly, img, early) }

// mark records whether img is in the state's set m.
func (a *Agent) mark(m *map[string]bool, img string, on bool) {
	if (*m)[img] == on {
		return
	}
	if on {
		if *m == nil {
			*m = map[string]bool{}
		}
		(*m)[img] = true
	} else {
		delete(*m, img)
	}
	a.in.dataDirty = true
}

// forgetPulledEarly drops the mark of images pulled early that no desired set names any
// more: one a set names later is an image the node holds, as any other.
func (a *Agent) forgetPulledEarly(desired []pinset.Set) {
	if len(a.in.data.PulledEarly) == 0 {
		return
	}
	named := map[string]bool{}
	for _, s := range desired {
		for _, ref := range s.Images {
			named[ref] = true
		}
	}
	for img := range a.in.data.PulledEarly {
		if !named[img] {
			a.markPulledEarly(img, false)
		}
	}
}

// adoptHeld takes every pin the runtime holds for imagepind (CRI-O's managed drop-in on
// disk, the labels imagepind set on containerd) that the state does not know (a state
// file lost, corrupt, or older) into the state, released now: the first pass keeps those
// a desired set still wants, and the others go after unpin_delay like any released pin,
// so a restart never empties the runtime's pins.
func (a *Agent) adoptHeld() {
	now := a.deps.Clock.Now()
	for _, p := range a.pinners() {
		adopted := 0
		for _, ref := range p.Held() {
			if _, known := a.in.data.Pins[ref]; known {
				continue
			}
			a.setPin(ref, now)
			adopted++
		}
		if adopted > 0 {
			a.log.WithField("patterns", adopted).WithField("where", p.Describe()).
				Warn("the runtime holds pins the state does not know (state lost or older): keeping them; those no set wants go after unpin_delay")
		}
	}
}

// applyAndConfirm puts the written pins in effect (CRI-O: a reload) unless the runtime
// has them already, and waits until the runtime shows them: a reload only sends SIGHUP,
// and CRI-O re-reads its config after the job is "done"; containerd's CRI plugin learns
// of a label from an event.
func (a *Agent) applyAndConfirm(ctx context.Context, changed bool) error {
	inEffect := func() (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
		defer cancel()
		ok, err := a.rt.pinner.InEffect(cctx, a.pins.effective)
		return ok && err == nil && a.probePinned(ctx), err
	}
	if !changed {
		// After a restart the pins may be in effect already: look before applying.
		if ok, _ := inEffect(); ok {
			a.pinsConfirmed(0)
			return nil
		}
	}
	start := a.deps.Clock.Now()
	rctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	err := a.rt.pinner.Apply(rctx)
	cancel()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(a.cfg.ConfirmTimeout)
	delay := 5 * time.Millisecond
	for {
		ok, err := inEffect()
		if ok {
			a.pinsConfirmed(a.deps.Clock.Now().Sub(start))
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if err != nil {
				return fmt.Errorf("pins applied but not in effect after %s: %w", a.cfg.ConfirmTimeout, err)
			}
			return fmt.Errorf("pins applied but not in effect after %s: the runtime does not report a newly pinned image pinned", a.cfg.ConfirmTimeout)
		}
		// A wait with a deadline is progress, not a hang: keep systemd's watchdog fed
		// (CRI-O slow to re-read its config after a restart must not get imagepind killed).
		a.deps.Alive()
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		delay = min(delay*2, time.Second)
	}
}

// probePinned checks that CRI-O's image service uses the new patterns too: on SIGHUP
// CRI-O updates the config GET /config shows before it recompiles the patterns that
// ImageStatus reports "pinned" from (server.go startReloadWatcher). It swaps the whole
// list at once, so one present image that this change pins is enough; an image that
// was pinned before proves nothing.
func (a *Agent) probePinned(ctx context.Context) bool {
	if !a.rt.support.PinnedField {
		return true
	}
	var probe string
	for ref, img := range a.pulls.images {
		newlyPinned := a.pins.effMatch.match(a.pins.effective, ref) && !a.pins.confMatch.match(a.pins.confirmed, ref)
		if img.wanted && img.present && newlyPinned && (probe == "" || ref < probe) {
			probe = ref
		}
	}
	if probe == "" {
		return true
	}
	cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	st, err := a.deps.Runtime.ImageStatus(cctx, probe)
	return err == nil && (!st.Present || st.Pinned)
}

func (a *Agent) pinsConfirmed(took time.Duration) {
	a.pins.confirmed = slices.Clone(a.pins.effective)
	a.pins.confirmedValid = true
	// Pull results that saw an older generation may carry a stale pinned flag.
	a.pins.gen++
	a.log.WithField("patterns", len(a.pins.effective)).WithField("took", took.Round(time.Millisecond).String()).Info("pins confirmed in effect")
	// Pins changed: the runtime's pinned flag of present images may have changed too.
	for _, img := range a.pulls.images {
		if img.present {
			img.checked = false
		}
	}
}

// pinsInEffect says whether pulls may start: pins confirmed, or a runtime too old to
// confirm (it applies them at its next start; status says so).
func (a *Agent) pinsInEffect() bool {
	if !a.rt.up() {
		return false
	}
	return a.pins.confirmedValid || !a.rt.support.WithoutRestart
}

// sameSet compares pattern lists as CRI-O matches them: order-free, case-insensitive.
func sameSet(a, b []string) bool { return pin.SamePatterns(a, b) }

// patternMatcher is a pin.Matcher compiled for the pattern list last asked about
// (a.pins.effective, a.pins.confirmed): recompiled only when the agent replaces the list.
type patternMatcher struct {
	src []string
	m   *pin.Matcher
}

func (p *patternMatcher) match(patterns []string, name string) bool {
	if p.m == nil || len(p.src) != len(patterns) || (len(patterns) > 0 && &p.src[0] != &patterns[0]) {
		p.src, p.m = patterns, pin.NewMatcher(patterns)
	}
	return p.m.Match(name)
}
