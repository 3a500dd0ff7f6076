package diskcheck

import (
	"context"
	"time"

	"github.com/imagepin/imagepin/status"
)

// SetRequest is one set to check: its name, the images this node still misses and
// those it holds already.
type SetRequest struct {
	Name    string
	Missing []string
	// Present are the set's images the runtime holds already: they need no room to be
	// pulled, but with Config.KeepsCompressed the node-local mirror's store keeps their
	// compressed blobs too, and the layers it lacks are counted (package peers' keeper
	// fetches them).
	Present []string
	// Pulling are images of Missing being pulled before the set's verdict (Early): they
	// take room whatever the verdict, so the check counts them (at their most) before it
	// admits any set.
	Pulling []string
}

// Early is what a check still under way has proven may be pulled before its verdict:
// the images of the one set missing any whose layers, each at the most its Range
// request could report (NeedMost), fit the room together. Pulling them keeps the image
// filesystem within the room whatever the verdict, as far as the check can know a
// layer's size at all (as for its verdict: a gzip trailer holds the size modulo 4 GiB,
// and a layer of a format it cannot read counts at the multiplier). A set refused
// afterwards keeps them on the node unpinned; until they land, a check counts them
// first, before any set (SetRequest.Pulling).
type Early struct {
	Set    string
	Images []string
	// Layers maps each image to its layers' compressed digests (Verdict.Layers), and
	// Bytes to its compressed layer bytes (Verdict.Bytes).
	Layers map[string][]string
	Bytes  map[string]uint64
	// RoundTrip is Result.RoundTrip so far: where the pull width starts.
	RoundTrip time.Duration
}

// Verdict is the check's answer for one set.
type Verdict struct {
	// Admitted: pin and pull the set. A set not admitted whose Condition is Unknown is
	// undecided (a registry could not be asked): the caller keeps its earlier verdict.
	Admitted bool
	// Condition is the set's DiskChecked condition (its time is set by the caller).
	Condition status.Condition
	// Need is what the set needs on the image filesystem: its missing images' layers,
	// each at the floor (layer_size_multiplier × compressed) or at its uncompressed size
	// + compressed where asked and larger, and with Config.KeepsCompressed the
	// compressed layers the node-local mirror's store will keep (of present images
	// too). NeedMost is the most it can be: Need, unless uncompressed sizes were not
	// asked (they could not change the verdict): then each such layer at the most its
	// format can hold. The real need lies between the two.
	Need, NeedMost uint64
	// ForStore are the compressed bytes of Need the node-local mirror's store will
	// grow by (the set's layers it does not hold yet; Config.KeepsCompressed).
	ForStore uint64
	// Bytes maps each sized image to its compressed layer bytes.
	Bytes map[string]uint64
	// Layers maps each sized image to its layers' compressed digests, in the manifest's
	// order: what the agent orders pulls by, so that no layer is fetched by two pulls
	// at once.
	Layers map[string][]string
	// Unavailable maps images no endpoint can serve to why, naming every endpoint tried.
	Unavailable map[string]string
	// Unsized maps images that could not be sized for a reason that may pass (network,
	// 5xx) to that error. They are left out of the need and must not be pulled until a
	// later check sizes them; the set's other images go ahead.
	Unsized map[string]string
}

// Filesystem is the image filesystem as the check saw it.
type Filesystem = status.ImageFilesystem

// Result is one check of all the node's sets.
type Result struct {
	Verdicts   map[string]Verdict
	Filesystem Filesystem
	// RoundTrip is the least time of a request to the registries sized (0: none
	// asked): how far they are.
	RoundTrip time.Duration
}

// AdmitAll admits every set with DiskChecked Unknown/NotImplemented: for tests that are
// not about disk space.
type AdmitAll struct{}

// Check admits every set.
func (AdmitAll) Check(_ context.Context, sets []SetRequest, _ func(Early)) (Result, error) {
	out := make(map[string]Verdict, len(sets))
	for _, s := range sets {
		out[s.Name] = Verdict{
			Admitted: true,
			Condition: status.Condition{
				Type: status.ConditionDiskChecked, Status: status.Unknown, Reason: status.ReasonNotImplemented,
				Message: "no disk check: the set is admitted without one",
			},
		}
	}
	return Result{Verdicts: out}, nil
}
