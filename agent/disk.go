package agent

import (
	"context"
	"fmt"
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
			if img := a.images[ref]; img == nil || !img.present {
				r.Missing = append(r.Missing, ref)
			}
		}
		reqs = append(reqs, r)
	}
	if a.verdicts == nil {
		a.verdicts = map[string]diskcheck.Verdict{}
	}
	if a.diskRunning || (!a.diskRetry.scheduled(now) && !a.diskDirty(reqs)) {
		return a.admitted(desired)
	}
	a.diskRunning, a.diskStarted = true, now
	a.lastDiskReqs = reqs
	a.background(diskCheckTimeout, func(ctx context.Context) func() {
		res, err := a.deps.Disk.Check(ctx, reqs)
		return func() { a.diskChecked(reqs, res, err) }
	})
	return a.admitted(desired)
}

// diskChecked takes a disk check's answer to reqs, on the loop.
func (a *Agent) diskChecked(reqs []diskcheck.SetRequest, res diskcheck.Result, err error) {
	now := a.deps.Clock.Now()
	a.diskRunning = false
	a.diskErr = err
	if err != nil {
		a.log.WithError(err).Warn("disk check failed; keeping earlier verdicts")
		a.diskRetry.fail(now, a.cfg.MaxBackoff, a.rand)
		return
	}
	if res.Filesystem.Path != "" {
		a.imageFS = res.Filesystem
	}
	// How far the registry is sets where the pull width starts.
	a.width.Link(res.RoundTrip)
	a.observeWidth()
	a.log.WithField("registry_round_trip", res.RoundTrip.String()).WithField("width", a.width.Width()).Debug("disk check done")
	retry := false
	verdicts := make(map[string]diskcheck.Verdict, len(res.Verdicts))
	for name, v := range res.Verdicts {
		undecided := !v.Admitted && v.Condition.Status == status.Unknown
		if undecided {
			if prev, ok := a.verdicts[name]; ok && prev.Admitted {
				v.Admitted = true
			}
		}
		if prev, ok := a.verdicts[name]; ok && prev.Admitted != v.Admitted {
			a.log.WithField("set", name).WithField("admitted", v.Admitted).Info(v.Condition.Message)
		} else if !ok && !v.Admitted {
			a.log.WithField("set", name).Warn(v.Condition.Message)
		} else if !ok {
			a.log.WithField("set", name).WithField("took", now.Sub(a.diskStarted).Round(time.Millisecond).String()).
				WithField("registry_round_trip", res.RoundTrip.Round(100*time.Microsecond).String()).Info("disk check admitted the set: " + v.Condition.Message)
		}
		if !v.Admitted || undecided || len(v.Unavailable) > 0 || len(v.Unsized) > 0 {
			retry = true
		}
		for image, b := range v.Bytes {
			if a.data.Sizes[image] != b {
				if a.data.Sizes == nil {
					a.data.Sizes = map[string]uint64{}
				}
				a.data.Sizes[image] = b
				a.dataDirty = true
			}
		}
		verdicts[name] = v
	}
	a.verdicts = verdicts
	// A verdict admits the pulls of the images it was asked about, no others: an image a
	// set gained since waits for the check that counts it.
	a.sized = map[string]map[string]bool{}
	for _, r := range reqs {
		m := make(map[string]bool, len(r.Missing))
		for _, ref := range r.Missing {
			m[ref] = true
		}
		a.sized[r.Name] = m
	}
	if retry {
		a.diskRetry.fail(now, a.cfg.MaxBackoff, a.rand)
	} else {
		a.diskRetry.reset()
	}
}

// diskDirty says whether the check must run again: a set came or went, or a set misses
// an image the last check was not asked about (a new image, one gone from the node). A
// set that only misses fewer (images landing as they are pulled) needs no new verdict:
// each check costs the runtime an ImageFsInfo and the registries their requests.
func (a *Agent) diskDirty(reqs []diskcheck.SetRequest) bool {
	if len(reqs) != len(a.lastDiskReqs) {
		return true
	}
	for i, r := range reqs {
		last := a.lastDiskReqs[i]
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

func (a *Agent) admitted(desired []pinset.Set) []pinset.Set {
	var out []pinset.Set
	for _, s := range desired {
		if v, ok := a.verdicts[s.Name]; ok && v.Admitted {
			out = append(out, s)
		}
	}
	return out
}

// diskPending says what a set not checked yet waits for.
func (a *Agent) diskPending() string {
	if a.diskRunning {
		return fmt.Sprintf("sizing the missing images from their registries (running for %s)",
			a.deps.Clock.Now().Sub(a.diskStarted).Round(time.Second))
	}
	return "not checked yet"
}
