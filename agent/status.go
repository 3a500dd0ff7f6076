package agent

import (
	"errors"
	"reflect"
	"sort"
	"time"

	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/state"
	"github.com/imagepin/imagepin/status"
)

// publish computes the node status and hands it on when it changed.
func (a *Agent) publish(desired []pinset.Set) {
	now := a.deps.Clock.Now()
	n := status.Node{
		Node: status.NodeInfo{
			Name: a.cfg.NodeName, Architecture: a.cfg.Architecture, Version: a.cfg.Version,
			Runtime:         status.Runtime{Name: a.runtime.Name, Version: a.runtime.Version},
			ImageFilesystem: a.imageFS,
		},
		Sets:       []status.Set{},
		FileErrors: a.fileErrors,
	}
	n.Faults = append(n.Faults, a.inputFaults...)
	n.Faults = append(n.Faults, a.pinFaults...)
	if a.runtimeErr != nil {
		n.Faults = append(n.Faults, "container runtime unavailable: "+a.runtimeErr.Error())
	}
	if a.diskErr != nil {
		n.Faults = append(n.Faults, "disk check: "+a.diskErr.Error())
	}
	for _, s := range desired {
		var prev *status.Set
		if p := a.last.Set(s.Name); p != nil {
			prev = p
		}
		n.Sets = append(n.Sets, a.setStatus(s, prev))
	}
	n.SortSets()
	a.recordCompleted(n)

	// Condition times were carried over from the last status; compare without the clock.
	if a.published && reflect.DeepEqual(withoutTime(n), withoutTime(a.last)) {
		return
	}
	n.Updated = now
	a.last = n
	a.published = true
	a.deps.Publish(n)
}

func withoutTime(n status.Node) status.Node {
	n.Updated = time.Time{}
	return n
}

// setStatus derives one set's phase and conditions from the agent's state.
func (a *Agent) setStatus(s pinset.Set, prev *status.Set) status.Set {
	now := a.deps.Clock.Now()
	st := status.Set{Name: s.Name, UID: s.UID, SpecHash: s.SpecHash, File: s.File, ImagesTotal: len(s.Images), Release: a.releaseStatus(s)}
	if prev != nil && prev.UID == s.UID {
		st.Conditions = append(st.Conditions, prev.Conditions...)
	}
	verdict, checked := a.verdicts[s.Name]
	f := setFacts{
		Total:          st.ImagesTotal,
		DiskChecked:    checked,
		DiskAdmitted:   verdict.Admitted,
		DiskCondition:  verdict.Condition,
		DiskPending:    a.diskPending(),
		RuntimeKnown:   a.runtime.Version != "",
		RuntimeUp:      a.runtimeUp(),
		RuntimeErr:     a.runtimeErr,
		RuntimeLabel:   a.runtimeLabel(),
		RuntimeProblem: a.support.Problem,
		PinsConfirmed:  a.confirmedValid,
		Overriders:     a.overriders,
	}
	if len(a.pinFaults) > 0 {
		f.LastPinFault = a.pinFaults[len(a.pinFaults)-1]
	}
	f.Release.Phase, f.Release.Reason, f.Release.Message, f.Release.Problem = a.releaseProblem(s)

	pinnedByRuntime := a.support.PinnedField
	for _, ref := range s.Images {
		img := a.images[ref]
		size := a.data.Sizes[ref]
		st.BytesTotal += size
		if img == nil || !img.present {
			f.Absent++
		}
		if img == nil {
			continue
		}
		if img.present {
			if pinnedByRuntime && !img.pinned && a.confirmedValid {
				f.NotPinned++
			}
			if !pinnedByRuntime || img.pinned {
				st.ImagesReady++
				st.BytesReady += size
			}
			continue
		}
		if why, ok := verdict.Unsized[ref]; ok {
			f.Transient = errors.New(why)
			continue
		}
		if why, ok := verdict.Unavailable[ref]; ok {
			f.Unavailable++
			st.FailedImages = append(st.FailedImages, status.FailedImage{Image: ref, Reason: status.ReasonImageUnavailable, Error: why})
			continue
		}
		if img.lastErr == nil {
			continue
		}
		switch img.failure {
		case cri.Unavailable:
			f.Unavailable++
			st.FailedImages = append(st.FailedImages, status.FailedImage{Image: ref, Reason: status.ReasonImageUnavailable, Error: img.lastErr.Error()})
		case cri.NoSpace:
			f.NoSpace++
			st.FailedImages = append(st.FailedImages, status.FailedImage{Image: ref, Reason: status.ReasonInsufficientDiskSpace, Error: img.lastErr.Error()})
		default:
			f.Transient = img.lastErr
		}
	}
	if len(a.overriders) > 0 {
		for _, ref := range s.Images {
			if !a.effMatch.match(a.effective, ref) {
				f.Overridden++
			}
		}
	}
	f.Ready = st.ImagesReady

	o := decidePhase(f)
	st.Phase = o.Phase
	for _, c := range setConditions(o, f) {
		st.SetCondition(c, now)
	}
	sort.Slice(st.FailedImages, func(i, j int) bool { return st.FailedImages[i].Image < st.FailedImages[j].Image })
	return st
}

// recordCompleted remembers which set versions were Ready, for the next start's log.
func (a *Agent) recordCompleted(n status.Node) {
	if a.data.Completed == nil {
		a.data.Completed = map[string]state.Completed{}
	}
	for _, s := range n.Sets {
		if s.Phase != status.Ready {
			continue
		}
		c := a.data.Completed[s.Name]
		if c.UID != s.UID || c.SpecHash != s.SpecHash {
			a.data.Completed[s.Name] = state.Completed{UID: s.UID, SpecHash: s.SpecHash, At: a.deps.Clock.Now()}
			a.dataDirty = true
			a.log.WithField("set", s.Name).WithField("images", s.ImagesTotal).Info("set Ready")
		}
	}
	names := map[string]bool{}
	wanted := map[string]bool{}
	for _, s := range a.sets {
		names[s.Name] = true
		for _, img := range s.Images {
			wanted[img] = true
		}
	}
	for img := range a.data.Sizes {
		if !wanted[img] {
			delete(a.data.Sizes, img)
			a.dataDirty = true
		}
	}
	for name := range a.data.Completed {
		if !names[name] {
			delete(a.data.Completed, name)
			a.dataDirty = true
		}
	}
}
