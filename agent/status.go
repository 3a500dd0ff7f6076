package agent

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
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

	var transient error
	var unavailable, noSpace int
	pinnedByCRIO := a.support.PinnedField
	notPinned := 0
	absent := 0 // not known to be on the node: what the disk check gates
	for _, ref := range s.Images {
		img := a.images[ref]
		size := a.data.Sizes[ref]
		st.BytesTotal += size
		if img == nil || !img.present {
			absent++
		}
		if img == nil {
			continue
		}
		if img.present {
			if pinnedByCRIO && !img.pinned && a.confirmedValid {
				notPinned++
			}
			if !pinnedByCRIO || img.pinned {
				st.ImagesReady++
				st.BytesReady += size
			}
			continue
		}
		if why, ok := verdict.Unsized[ref]; ok {
			transient = errors.New(why)
			continue
		}
		if why, ok := verdict.Unavailable[ref]; ok {
			unavailable++
			st.FailedImages = append(st.FailedImages, status.FailedImage{Image: ref, Reason: status.ReasonImageUnavailable, Error: why})
			continue
		}
		if img.lastErr == nil {
			continue
		}
		switch img.failure {
		case cri.Unavailable:
			unavailable++
			st.FailedImages = append(st.FailedImages, status.FailedImage{Image: ref, Reason: status.ReasonImageUnavailable, Error: img.lastErr.Error()})
		case cri.NoSpace:
			noSpace++
			st.FailedImages = append(st.FailedImages, status.FailedImage{Image: ref, Reason: status.ReasonInsufficientDiskSpace, Error: img.lastErr.Error()})
		default:
			transient = img.lastErr
		}
	}
	overridden := 0
	if len(a.overriders) > 0 {
		for _, ref := range s.Images {
			if !a.effMatch.match(a.effective, ref) {
				overridden++
			}
		}
	}

	phase, reason, msg := status.Pulling, status.ReasonPulling, ""
	progressing := true
	missing := st.ImagesTotal - st.ImagesReady
	relPhase, relReason, relMsg, relProblem := a.releaseProblem(s)
	gated := (!checked || !verdict.Admitted) && absent > 0
	switch {
	case relProblem:
		phase, reason, msg, progressing = relPhase, relReason, relMsg, relPhase != status.Failed
	// The disk check gates pulls only: a set with every image on the node is not held
	// back by it (its pins are kept whatever it says).
	case gated && checked && verdict.Condition.Reason == status.ReasonInsufficientDiskSpace:
		phase, reason, msg, progressing = status.Failed, status.ReasonInsufficientDiskSpace, verdict.Condition.Message, false
		if absent < st.ImagesTotal {
			msg += fmt.Sprintf("; the %d images already present stay pinned", st.ImagesTotal-absent)
		}
	case gated && !a.runtimeUp():
		phase, reason = status.Pending, status.ReasonRuntimeUnavailable
		msg = "container runtime unavailable; retrying"
		if a.runtimeErr != nil {
			msg += ": " + a.runtimeErr.Error()
		}
	case gated:
		phase, reason, msg = status.Pending, status.ReasonCheckingDisk, "waiting for the disk check: "+a.diskPending()
		if verdict.Condition.Message != "" {
			msg = verdict.Condition.Message
		}
	case a.runtime.Version != "" && a.support.Problem != "":
		phase, reason, msg, progressing = status.Failed, status.ReasonRuntimeTooOld, a.support.Problem, false
	case overridden > 0:
		phase, reason, progressing = status.Failed, status.ReasonPinsOverridden, false
		msg = fmt.Sprintf("%d of %d images are not pinned: %s sets pinned_images and is read after imagepin's drop-in, so CRI-O uses its list", overridden, st.ImagesTotal, strings.Join(a.overriders, ", "))
	case !a.runtimeUp():
		phase, reason = status.Pending, status.ReasonRuntimeUnavailable
		msg = "container runtime unavailable; retrying"
		if a.runtimeErr != nil {
			msg += ": " + a.runtimeErr.Error()
		}
	case !a.confirmedValid:
		phase, reason, msg = status.Pending, status.ReasonWaitingForReload, "pins written; waiting for "+a.runtimeLabel()+" to have them in effect"
		if len(a.pinFaults) > 0 {
			msg += ": " + a.pinFaults[len(a.pinFaults)-1]
		}
	case missing == 0:
		phase, reason, progressing = status.Ready, status.ReasonAllImagesPinned, false
		msg = fmt.Sprintf("%d images present and pinned", st.ImagesTotal)
	case noSpace > 0:
		phase, reason, progressing = status.Failed, status.ReasonInsufficientDiskSpace, false
		msg = fmt.Sprintf("the image filesystem is full: %d images could not be stored; pulls stopped and retried with backoff", noSpace)
	case unavailable > 0 && unavailable+notPinned == missing:
		phase, reason, progressing = status.Failed, status.ReasonImageUnavailable, false
		msg = fmt.Sprintf("%d of %d images cannot be pulled (see failedImages); the others are present and pinned", unavailable, st.ImagesTotal)
	case transient != nil:
		reason = status.ReasonPullRetrying
		msg = fmt.Sprintf("%d/%d images ready; retrying after: %v", st.ImagesReady, st.ImagesTotal, transient)
	default:
		msg = fmt.Sprintf("%d/%d images ready", st.ImagesReady, st.ImagesTotal)
		if notPinned > 0 {
			msg += fmt.Sprintf("; %d present but not pinned by %s yet", notPinned, a.runtimeLabel())
		}
	}
	st.Phase = phase

	ready := status.Condition{Type: status.ConditionReady, Status: status.False, Reason: reason, Message: msg}
	if phase == status.Ready {
		ready.Status = status.True
	}
	prog := status.Condition{Type: status.ConditionProgressing, Status: status.False, Reason: status.ReasonIdle, Message: ""}
	if progressing {
		prog = status.Condition{Type: status.ConditionProgressing, Status: status.True, Reason: reason, Message: msg}
	}
	failed := status.Condition{Type: status.ConditionFailed, Status: status.False, Reason: status.ReasonNotFailed}
	if phase == status.Failed {
		failed = status.Condition{Type: status.ConditionFailed, Status: status.True, Reason: reason, Message: msg}
	}
	disk := verdict.Condition
	if !checked {
		disk = status.Condition{Type: status.ConditionDiskChecked, Status: status.Unknown, Reason: status.ReasonCheckingDisk, Message: a.diskPending()}
	}
	disk.Type = status.ConditionDiskChecked
	for _, c := range []status.Condition{ready, prog, failed, disk} {
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
