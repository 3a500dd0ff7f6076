package diskcheck

import (
	"context"

	"github.com/imagepin/imagepin/status"
)

// SetRequest is one set to check: its name and the images this node still misses.
type SetRequest struct {
	Name    string
	Missing []string
}

// Verdict is the check's answer for one set.
type Verdict struct {
	Admitted bool
	// Condition is the set's DiskChecked condition (its time is set by the caller).
	Condition status.Condition
	// Bytes maps each image of the set to its compressed layer bytes, when known.
	Bytes map[string]uint64
}

// Checker checks sets in the order given (name order) and returns one verdict a set.
type Checker interface {
	Check(ctx context.Context, sets []SetRequest) (map[string]Verdict, error)
}

// AdmitAll is the stub: every set is admitted, with DiskChecked Unknown/NotImplemented.
type AdmitAll struct{}

// Check admits every set.
func (AdmitAll) Check(_ context.Context, sets []SetRequest) (map[string]Verdict, error) {
	out := make(map[string]Verdict, len(sets))
	for _, s := range sets {
		out[s.Name] = Verdict{
			Admitted: true,
			Condition: status.Condition{
				Type: status.ConditionDiskChecked, Status: status.Unknown, Reason: status.ReasonNotImplemented,
				Message: "the disk check is not implemented yet: the set is admitted without one",
			},
		}
	}
	return out, nil
}
