package agent

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"time"

	"github.com/imagepin/imagepin/failure"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/registrygone"
	"github.com/imagepin/imagepin/state"
	"github.com/imagepin/imagepin/status"
)

// publish computes the node status and hands it on when it changed.
func (a *Agent) publish(desired []pinset.Set) {
	now := a.deps.Clock.Now()
	n := status.Node{
		Node: status.NodeInfo{
			Name: a.cfg.NodeName, Architecture: a.cfg.Architecture, Version: a.cfg.Version,
			Runtime:         status.Runtime{Name: a.rt.runtime.Name, Version: a.rt.runtime.Version},
			ImageFilesystem: a.disk.imageFS,
		},
		Sets:                  []status.Set{},
		FileErrors:            a.in.fileErrors,
		WaitingForClusterSync: a.in.waitingForSync,
		Blobs:                 a.imageBlobs(desired),
	}
	n.Faults = append(n.Faults, a.in.inputFaults...)
	if n.WaitingForClusterSync {
		n.Faults = append(n.Faults, status.FaultWaitingForClusterSync)
	}
	n.Faults = append(n.Faults, a.pins.faults...)
	if a.rt.err != nil {
		n.Faults = append(n.Faults, "container runtime unavailable: "+a.rt.err.Error())
	}
	if a.disk.err != nil {
		n.Faults = append(n.Faults, "disk check: "+a.disk.err.Error())
	}
	if a.deps.Tags != nil {
		var faults []string
		n.Tags, faults = a.deps.Tags.Status()
		n.Faults = append(n.Faults, faults...)
	}
	for _, s := range a.in.sets {
		if why, ok := s.Selector.SelectsNoNode(); ok {
			n.Untargeted = append(n.Untargeted, status.Untargeted{Name: s.Name, File: s.File, Why: why})
		}
	}
	sort.Slice(n.Untargeted, func(i, j int) bool { return n.Untargeted[i].Name < n.Untargeted[j].Name })
	if a.deps.Seeds != nil {
		var faults []string
		n.Node.Seeded, faults = a.deps.Seeds(pinnedRefs(desired))
		n.Faults = append(n.Faults, faults...)
	}
	for _, s := range desired {
		var prev *status.Set
		if p := a.out.last.Set(s.Name); p != nil {
			prev = p
		}
		n.Sets = append(n.Sets, a.setStatus(s, prev))
	}
	n.SortSets()
	a.recordCompleted(n)

	// Condition times were carried over from the last status; compare without the clock.
	if a.out.published && reflect.DeepEqual(withoutTime(n), withoutTime(a.out.last)) {
		return
	}
	n.Updated = now
	a.out.last = n
	a.out.published = true
	a.deps.Publish(n)
}

// pinnedRefs are the references the sets pin: each image (repo@digest), and each tag
// with its digest (repo:tag@digest).
func pinnedRefs(sets []pinset.Set) []string {
	var out []string
	for _, s := range sets {
		out = append(out, s.Images...)
		for _, t := range s.Tags {
			out = append(out, t.Name+"@"+t.Digest())
		}
	}
	return out
}

func withoutTime(n status.Node) status.Node {
	n.Updated = time.Time{}
	return n
}

// setStatus derives one set's phase and conditions from the agent's state.
func (a *Agent) setStatus(s pinset.Set, prev *status.Set) status.Set {
	now := a.deps.Clock.Now()
	st := status.Set{Name: s.Name, UID: s.UID, SpecHash: s.SpecHash, File: s.File, ImagesTotal: len(s.Images), Release: a.rel.status(s)}
	if prev != nil && prev.UID == s.UID {
		st.Conditions = append(st.Conditions, prev.Conditions...)
	}
	verdict, checked := a.disk.verdicts[s.Name]
	f := setFacts{
		Total:          st.ImagesTotal,
		DiskChecked:    checked,
		DiskAdmitted:   verdict.Admitted,
		DiskCondition:  verdict.Condition,
		DiskPending:    a.diskPending(),
		RuntimeKnown:   a.rt.runtime.Version != "",
		RuntimeUp:      a.rt.up(),
		RuntimeErr:     a.rt.err,
		RuntimeLabel:   a.rt.label(),
		RuntimeProblem: a.rt.support.Problem,
		PinsConfirmed:  a.pins.confirmedValid,
		Overriders:     a.pins.overriders,
	}
	if len(a.pins.faults) > 0 {
		f.LastPinFault = a.pins.faults[len(a.pins.faults)-1]
	}
	if a.disk.early.Set == s.Name {
		f.DiskPending += fmt.Sprintf("; meanwhile pulling %d of its images, which fit the room whatever it says", len(a.disk.early.Images))
	}
	f.Release.Phase, f.Release.Reason, f.Release.Message, f.Release.Problem = a.rel.problem(s)

	pinnedByRuntime := a.rt.support.PinnedField
	rf := registrygone.Facts{Images: s.Images, Tags: s.Tags, Held: a.tagsHeld(s.Tags), Holders: a.blobHolders(s.Name)}
	if !a.rt.up() {
		rf.RuntimeErr = a.rt.err
		if rf.RuntimeErr == nil {
			rf.RuntimeErr = errors.New("no answer yet")
		}
	}
	for _, ref := range s.Images {
		img := a.pulls.images[ref]
		size := a.in.data.Sizes[ref]
		st.BytesTotal += size
		if a.deps.RegistryBytes != nil {
			st.BytesFromRegistry += a.deps.RegistryBytes(ref)
		}
		if img == nil || !img.present {
			f.Absent++
			rf.Missing = append(rf.Missing, ref)
		}
		if img == nil {
			continue
		}
		if img.present {
			if a.in.data.PulledEarly[ref] {
				f.PulledEarly++
			}
			if pinnedByRuntime && !img.pinned {
				rf.Unpinned = append(rf.Unpinned, ref)
			}
			if pinnedByRuntime && !img.pinned && a.pins.confirmedValid {
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
		case failure.Unavailable:
			f.Unavailable++
			st.FailedImages = append(st.FailedImages, status.FailedImage{Image: ref, Reason: status.ReasonImageUnavailable, Error: img.lastErr.Error()})
		case failure.NoSpace:
			f.NoSpace++
			st.FailedImages = append(st.FailedImages, status.FailedImage{Image: ref, Reason: status.ReasonInsufficientDiskSpace, Error: img.lastErr.Error()})
		default:
			f.Transient = img.lastErr
		}
	}
	if len(a.pins.overriders) > 0 {
		for _, ref := range s.Images {
			if !a.pins.effMatch.match(a.pins.effective, ref) {
				f.Overridden++
			}
		}
	}
	f.Ready = st.ImagesReady

	o := decidePhase(f)
	st.Phase = o.Phase
	conds := append(setConditions(o, f), registryConditions(o, a.kube, rf)...)
	for _, c := range conds {
		st.SetCondition(c, now)
	}
	sort.Slice(st.FailedImages, func(i, j int) bool { return st.FailedImages[i].Image < st.FailedImages[j].Image })
	return st
}

// recordCompleted remembers which set versions were Ready, for the next start's log.
func (a *Agent) recordCompleted(n status.Node) {
	if a.in.data.Completed == nil {
		a.in.data.Completed = map[string]state.Completed{}
	}
	for _, s := range n.Sets {
		if s.Phase != status.Ready {
			continue
		}
		c := a.in.data.Completed[s.Name]
		if c.UID != s.UID || c.SpecHash != s.SpecHash {
			a.in.data.Completed[s.Name] = state.Completed{UID: s.UID, SpecHash: s.SpecHash, At: a.deps.Clock.Now()}
			a.in.dataDirty = true
			a.log.WithField("set", s.Name).WithField("images", s.ImagesTotal).Info("set Ready")
		}
	}
	names := map[string]bool{}
	wanted := map[string]bool{}
	for _, s := range a.in.sets {
		names[s.Name] = true
		for _, img := range s.Images {
			wanted[img] = true
		}
	}
	for img := range a.in.data.Sizes {
		if !wanted[img] {
			delete(a.in.data.Sizes, img)
			a.in.dataDirty = true
		}
	}
	for name := range a.in.data.Completed {
		if !names[name] {
			delete(a.in.data.Completed, name)
			a.in.dataDirty = true
		}
	}
}
