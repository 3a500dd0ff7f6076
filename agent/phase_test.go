package agent

import (
	"errors"
	"strings"
	"testing"

	"github.com/imagepin/imagepin/status"
)

// healthy is a set of 10 images, all on the node and pinned, the runtime up and the
// pins confirmed: each row below changes what it names.
func healthy() setFacts {
	return setFacts{
		Total: 10, Ready: 10,
		DiskChecked: true, DiskAdmitted: true,
		DiskCondition: status.Condition{Status: status.True, Reason: status.ReasonSpaceAvailable, Message: "need 2 GB of 40 GB"},
		RuntimeKnown:  true, RuntimeUp: true, RuntimeLabel: "CRI-O",
		PinsConfirmed: true,
	}
}

func TestDecidePhase(t *testing.T) {
	full := status.Condition{Status: status.False, Reason: status.ReasonInsufficientDiskSpace, Message: "need 30 GB, 5 GB free"}
	cases := []struct {
		name   string
		change func(*setFacts)
		phase  status.Phase
		reason string
		// progressing is the Progressing condition; msg a part of the message.
		progressing bool
		msg         string
	}{
		{"all present and pinned", func(f *setFacts) {}, status.Ready, status.ReasonAllImagesPinned, false, "10 images present and pinned"},
		{"pulling", func(f *setFacts) { f.Ready, f.Absent = 4, 6 }, status.Pulling, status.ReasonPulling, true, "4/10 images ready"},
		{"present, runtime has not reported them pinned", func(f *setFacts) { f.Ready, f.NotPinned = 8, 2 },
			status.Pulling, status.ReasonPulling, true, "2 present but not pinned by CRI-O yet"},
		{"transient pull error", func(f *setFacts) { f.Ready, f.Absent, f.Transient = 9, 1, errors.New("503") },
			status.Pulling, status.ReasonPullRetrying, true, "retrying after: 503"},
		{"every missing image unavailable", func(f *setFacts) { f.Ready, f.Absent, f.Unavailable = 8, 2, 2 },
			status.Failed, status.ReasonImageUnavailable, false, "2 of 10 images cannot be pulled"},
		{"unavailable plus present-not-pinned is still unavailable", func(f *setFacts) { f.Ready, f.Absent, f.Unavailable, f.NotPinned = 7, 2, 2, 1 },
			status.Failed, status.ReasonImageUnavailable, false, "2 of 10"},
		{"some unavailable, others still coming", func(f *setFacts) { f.Ready, f.Absent, f.Unavailable = 5, 5, 2 },
			status.Pulling, status.ReasonPulling, true, "5/10 images ready"},
		{"pull found the filesystem full", func(f *setFacts) { f.Ready, f.Absent, f.NoSpace, f.Unavailable = 5, 5, 3, 2 },
			status.Failed, status.ReasonInsufficientDiskSpace, false, "3 images could not be stored"},
		{"pins not confirmed yet", func(f *setFacts) { f.PinsConfirmed, f.LastPinFault = false, "reload timed out" },
			status.Pending, status.ReasonWaitingForReload, true, "waiting for CRI-O to have them in effect: reload timed out"},
		{"runtime down after the disk check", func(f *setFacts) { f.RuntimeUp, f.RuntimeErr = false, errors.New("dial unix: refused") },
			status.Pending, status.ReasonRuntimeUnavailable, true, "unavailable; retrying: dial unix: refused"},
		{"pins overridden by a later drop-in", func(f *setFacts) { f.Overridden, f.Overriders = 3, []string{"99-admin.conf"} },
			status.Failed, status.ReasonPinsOverridden, false, "3 of 10 images are not pinned: 99-admin.conf"},
		{"overridden beats a runtime that is down", func(f *setFacts) { f.Overridden, f.RuntimeUp = 1, false },
			status.Failed, status.ReasonPinsOverridden, false, ""},
		{"runtime too old", func(f *setFacts) { f.RuntimeProblem = "CRI-O 1.28 has no pinned_images" },
			status.Failed, status.ReasonRuntimeTooOld, false, "1.28"},
		{"too-old is only said of a runtime that answered", func(f *setFacts) { f.RuntimeProblem, f.RuntimeKnown = "old", false },
			status.Ready, status.ReasonAllImagesPinned, false, ""},
		{"not checked, images absent: waits for the check", func(f *setFacts) {
			f.Ready, f.Absent, f.DiskChecked, f.DiskAdmitted, f.DiskCondition = 0, 10, false, false, status.Condition{}
			f.DiskPending = "sizing the missing images from their registries (running for 3s)"
		}, status.Pending, status.ReasonCheckingDisk, true, "waiting for the disk check: sizing"},
		{"not checked, all present: not held back", func(f *setFacts) { f.DiskChecked, f.DiskAdmitted = false, false },
			status.Ready, status.ReasonAllImagesPinned, false, ""},
		{"undecided verdict keeps its message", func(f *setFacts) {
			f.Ready, f.Absent, f.DiskAdmitted = 0, 10, false
			f.DiskCondition = status.Condition{Status: status.Unknown, Reason: status.ReasonCheckingDisk, Message: "registry unreachable"}
		}, status.Pending, status.ReasonCheckingDisk, true, "registry unreachable"},
		{"disk full before pulling", func(f *setFacts) { f.Ready, f.Absent, f.DiskAdmitted, f.DiskCondition = 4, 6, false, full },
			status.Failed, status.ReasonInsufficientDiskSpace, false, "need 30 GB, 5 GB free; the 4 images already present stay pinned"},
		{"disk full beats a runtime that is down", func(f *setFacts) {
			f.Absent, f.Ready, f.DiskAdmitted, f.DiskCondition, f.RuntimeUp = 10, 0, false, full, false
		},
			status.Failed, status.ReasonInsufficientDiskSpace, false, "need 30 GB"},
		{"gated and runtime down: the runtime is named, not the disk", func(f *setFacts) {
			f.Ready, f.Absent, f.DiskChecked, f.DiskAdmitted, f.RuntimeUp = 0, 10, false, false, false
		}, status.Pending, status.ReasonRuntimeUnavailable, true, "container runtime unavailable"},
		{"release being expanded comes first", func(f *setFacts) {
			f.Release = releaseFacts{true, status.Pending, status.ReasonExpandingRelease, "reading release r from its registry"}
			f.RuntimeUp = false
		}, status.Pending, status.ReasonExpandingRelease, true, "reading release"},
		{"a release that cannot be read fails", func(f *setFacts) {
			f.Release = releaseFacts{true, status.Failed, status.ReasonInvalidSpec, "release r: not a release image"}
		}, status.Failed, status.ReasonInvalidSpec, false, "not a release image"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := healthy()
			c.change(&f)
			o := decidePhase(f)
			if o.Phase != c.phase || o.Reason != c.reason || o.Progressing != c.progressing || !strings.Contains(o.Message, c.msg) {
				t.Fatalf("got %s/%s progressing=%v %q; want %s/%s progressing=%v containing %q",
					o.Phase, o.Reason, o.Progressing, o.Message, c.phase, c.reason, c.progressing, c.msg)
			}
			conds := setConditions(o, f)
			byType := map[string]status.Condition{}
			for _, cd := range conds {
				byType[cd.Type] = cd
			}
			if got := byType[status.ConditionReady].Status == status.True; got != (c.phase == status.Ready) {
				t.Errorf("Ready condition %s for phase %s", byType[status.ConditionReady].Status, c.phase)
			}
			if got := byType[status.ConditionFailed].Status == status.True; got != (c.phase == status.Failed) {
				t.Errorf("Failed condition %s for phase %s", byType[status.ConditionFailed].Status, c.phase)
			}
			if got := byType[status.ConditionProgressing].Status == status.True; got != c.progressing {
				t.Errorf("Progressing condition %s, want %v", byType[status.ConditionProgressing].Status, c.progressing)
			}
			if d := byType[status.ConditionDiskChecked]; !f.DiskChecked && d.Status != status.Unknown {
				t.Errorf("DiskChecked %s without a verdict, want Unknown", d.Status)
			}
		})
	}
}
