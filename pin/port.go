package pin

import "context"

// Pinner is the runtime port: how pins are written, put in effect and read back on one
// container runtime. crio.Pinner writes CRI-O's managed drop-in and reloads CRI-O;
// containerd.Pinner sets containerd's pinned label on each image record. Everything
// else (sets, selectors, the disk check, pulls through CRI, status, reports) is shared
// and speaks to a runtime only through this. pintest.Run is its conformance suite, run
// on the fakes and on real CRI-O and containerd.
type Pinner interface {
	// Describe names where the pins go, for logs.
	Describe() string
	// Held lists what the runtime pins for imagepind now (at start: taken back into a
	// lost or older state).
	Held() []string
	// Write makes the runtime's configuration hold patterns, imagepind's pins; images
	// says what the agent last learned of an image (on the node, pinned).
	Write(ctx context.Context, patterns []string, images func(ref string) (present, pinned bool)) (Written, error)
	// Apply puts what Write changed in effect (CRI-O: a reload).
	Apply(ctx context.Context) error
	// InEffect says whether the runtime shows effective in effect (the CRI pinned flag
	// of a newly pinned image is checked beside it).
	InEffect(ctx context.Context, effective []string) (bool, error)
	// Pulled pins an image just pulled where the runtime pins image records rather
	// than names (containerd), saying whether it did.
	Pulled(ctx context.Context, ref string) (bool, error)
	// Support is what a runtime version does with pins.
	Support(version string) (Support, error)
}

// Watcher is a Pinner that follows the runtime's own events (containerd's image
// events): changed asks the agent for a pass. Watch runs until ctx ends.
type Watcher interface {
	Watch(ctx context.Context, changed func()) error
}

// RecordPinner is a Pinner whose runtime pins image records, not names (containerd: the
// label is set on the record after the pull; CRI-O: a pattern pins whatever is pulled
// by its name).
type RecordPinner interface {
	PinsRecords() bool
}

// PinsRecords says whether p pins image records (RecordPinner).
func PinsRecords(p Pinner) bool {
	r, ok := p.(RecordPinner)
	return ok && r.PinsRecords()
}
