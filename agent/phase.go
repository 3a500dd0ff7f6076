package agent

import (
	"fmt"
	"strings"

	"github.com/imagepin/imagepin/status"
)

// setFacts is everything one set's phase depends on, gathered by setStatus from the
// agent's parts. decidePhase reads nothing else.
type setFacts struct {
	Total, Ready int
	// Absent counts images not known to be on the node: what the disk check gates.
	Absent int
	// PulledEarly counts images present only for having been pulled before the disk
	// check's verdict (state.Data.PulledEarly): not pinned if it refuses the set.
	PulledEarly int
	// NotPinned counts images present but not yet reported pinned by the runtime.
	NotPinned int
	// Unavailable counts images that cannot be pulled (no endpoint serves them);
	// NoSpace those whose pull found the image filesystem full.
	Unavailable, NoSpace int
	// Transient is the last error that a retry may get past, if any.
	Transient error
	// Overridden counts images a later CRI-O drop-in (Overriders) left unpinned.
	Overridden int
	Overriders []string

	// Release is a release set's expansion problem; Problem false when there is none.
	Release releaseFacts
	// DiskChecked: a verdict exists; DiskAdmitted and DiskCondition are the verdict;
	// DiskPending says what the check is doing when there is none.
	DiskChecked, DiskAdmitted bool
	DiskCondition             status.Condition
	DiskPending               string

	// RuntimeKnown: the runtime answered Version once; RuntimeUp: it answers now.
	RuntimeKnown, RuntimeUp bool
	RuntimeErr              error
	RuntimeLabel            string
	// RuntimeProblem is why this runtime version cannot pin ("" when it can).
	RuntimeProblem string
	// PinsConfirmed: the runtime was confirmed to have the pins in effect;
	// LastPinFault is the newest reason it was not.
	PinsConfirmed bool
	LastPinFault  string
}

// releaseFacts is a release set's expansion, as the phase sees it.
type releaseFacts struct {
	Problem         bool
	Phase           status.Phase
	Reason, Message string
}

// phaseOutcome is the decided phase and what the Ready, Progressing and Failed
// conditions say.
type phaseOutcome struct {
	Phase           status.Phase
	Reason, Message string
	Progressing     bool
}

// decidePhase is the set's phase from its facts, a pure function. The order of the
// cases is the precedence: what blocks everything (a broken release, a full disk before
// pulling, a runtime that cannot pin) comes before what only delays.
func decidePhase(f setFacts) phaseOutcome {
	missing := f.Total - f.Ready
	// The disk check gates pulls only: a set with every image on the node is not held
	// back by it (its pins are kept whatever it says).
	gated := (!f.DiskChecked || !f.DiskAdmitted) && f.Absent > 0
	runtimeDown := func() phaseOutcome {
		msg := "container runtime unavailable; retrying"
		if f.RuntimeErr != nil {
			msg += ": " + f.RuntimeErr.Error()
		}
		return phaseOutcome{status.Pending, status.ReasonRuntimeUnavailable, msg, true}
	}
	switch {
	case f.Release.Problem:
		return phaseOutcome{f.Release.Phase, f.Release.Reason, f.Release.Message, f.Release.Phase != status.Failed}
	case gated && f.DiskChecked && f.DiskCondition.Reason == status.ReasonInsufficientDiskSpace:
		msg := f.DiskCondition.Message
		if held := f.Total - f.Absent - f.PulledEarly; held > 0 {
			msg += fmt.Sprintf("; the %d images already present stay pinned", held)
		}
		if f.PulledEarly > 0 {
			msg += fmt.Sprintf("; the %d pulled while the check ran stay on the node, unpinned", f.PulledEarly)
		}
		return phaseOutcome{status.Failed, status.ReasonInsufficientDiskSpace, msg, false}
	case gated && !f.RuntimeUp:
		return runtimeDown()
	case gated:
		msg := "waiting for the disk check: " + f.DiskPending
		if f.DiskCondition.Message != "" {
			msg = f.DiskCondition.Message
		}
		return phaseOutcome{status.Pending, status.ReasonCheckingDisk, msg, true}
	case f.RuntimeKnown && f.RuntimeProblem != "":
		return phaseOutcome{status.Failed, status.ReasonRuntimeTooOld, f.RuntimeProblem, false}
	case f.Overridden > 0:
		return phaseOutcome{status.Failed, status.ReasonPinsOverridden,
			fmt.Sprintf("%d of %d images are not pinned: %s sets pinned_images and is read after imagepin's drop-in, so CRI-O uses its list",
				f.Overridden, f.Total, strings.Join(f.Overriders, ", ")), false}
	case !f.RuntimeUp:
		return runtimeDown()
	case !f.PinsConfirmed:
		msg := "pins written; waiting for " + f.RuntimeLabel + " to have them in effect"
		if f.LastPinFault != "" {
			msg += ": " + f.LastPinFault
		}
		return phaseOutcome{status.Pending, status.ReasonWaitingForReload, msg, true}
	case missing == 0:
		return phaseOutcome{status.Ready, status.ReasonAllImagesPinned, fmt.Sprintf("%d images present and pinned", f.Total), false}
	case f.NoSpace > 0:
		return phaseOutcome{status.Failed, status.ReasonInsufficientDiskSpace,
			fmt.Sprintf("the image filesystem is full: %d images could not be stored; pulls stopped and retried with backoff", f.NoSpace), false}
	case f.Unavailable > 0 && f.Unavailable+f.NotPinned == missing:
		return phaseOutcome{status.Failed, status.ReasonImageUnavailable,
			fmt.Sprintf("%d of %d images cannot be pulled (see failedImages); the others are present and pinned", f.Unavailable, f.Total), false}
	case f.Transient != nil:
		return phaseOutcome{status.Pulling, status.ReasonPullRetrying,
			fmt.Sprintf("%d/%d images ready; retrying after: %v", f.Ready, f.Total, f.Transient), true}
	}
	msg := fmt.Sprintf("%d/%d images ready", f.Ready, f.Total)
	if f.NotPinned > 0 {
		msg += fmt.Sprintf("; %d present but not pinned by %s yet", f.NotPinned, f.RuntimeLabel)
	}
	return phaseOutcome{status.Pulling, status.ReasonPulling, msg, true}
}

// setConditions are the Ready, Progressing, Failed and DiskChecked conditions of an
// outcome (times are set by the caller, carried over when nothing changed).
func setConditions(o phaseOutcome, f setFacts) []status.Condition {
	ready := status.Condition{Type: status.ConditionReady, Status: status.False, Reason: o.Reason, Message: o.Message}
	if o.Phase == status.Ready {
		ready.Status = status.True
	}
	prog := status.Condition{Type: status.ConditionProgressing, Status: status.False, Reason: status.ReasonIdle}
	if o.Progressing {
		prog = status.Condition{Type: status.ConditionProgressing, Status: status.True, Reason: o.Reason, Message: o.Message}
	}
	failed := status.Condition{Type: status.ConditionFailed, Status: status.False, Reason: status.ReasonNotFailed}
	if o.Phase == status.Failed {
		failed = status.Condition{Type: status.ConditionFailed, Status: status.True, Reason: o.Reason, Message: o.Message}
	}
	disk := f.DiskCondition
	if !f.DiskChecked {
		disk = status.Condition{Status: status.Unknown, Reason: status.ReasonCheckingDisk, Message: f.DiskPending}
	}
	disk.Type = status.ConditionDiskChecked
	return []status.Condition{ready, prog, failed, disk}
}
