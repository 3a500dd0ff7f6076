package agent

import (
	"context"
	"fmt"
	"sort"

	"github.com/imagepin/imagepin/pin"
)

// Pinner is the one runtime-specific part of the agent: how pins are written, put in
// effect and read back. crio.Pinner writes CRI-O's managed drop-in and reloads CRI-O;
// containerd.Pinner sets containerd's pinned label on each image record. Sets,
// selectors, the disk check, pulls (CRI), status and reports are shared.
type Pinner interface {
	// Describe names where the pins go, for logs.
	Describe() string
	// Held lists what the runtime pins for imagepind now (at start: taken back into a
	// lost or older state).
	Held() []string
	// Write makes the runtime's configuration hold patterns, imagepind's pins; images
	// says what the agent last learned of an image (on the node, pinned).
	Write(ctx context.Context, patterns []string, images func(ref string) (present, pinned bool)) (pin.Written, error)
	// Apply puts what Write changed in effect (CRI-O: a reload).
	Apply(ctx context.Context) error
	// InEffect says whether the runtime shows effective in effect (the CRI pinned flag
	// of a newly pinned image is checked beside it).
	InEffect(ctx context.Context, effective []string) (bool, error)
	// Pulled pins an image just pulled where the runtime pins image records rather
	// than names (containerd), saying whether it did.
	Pulled(ctx context.Context, ref string) (bool, error)
	// Support is what a runtime version does with pins.
	Support(version string) (pin.Support, error)
}

// pinners lists the configured pinners, in name order.
func (a *Agent) pinners() []Pinner {
	names := make([]string, 0, len(a.deps.Pinners))
	for n := range a.deps.Pinners {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]Pinner, 0, len(names))
	for _, n := range names {
		out = append(out, a.deps.Pinners[n])
	}
	return out
}

// choosePinner picks the pinner for the runtime that answered CRI. With one configured
// ([cri] runtime named), it is the one whatever answers, and another runtime is a
// fault; with several (auto), the runtime's name decides.
func (a *Agent) choosePinner(runtimeName string) (Pinner, error) {
	if p, ok := a.deps.Pinners[runtimeName]; ok {
		return p, nil
	}
	if len(a.deps.Pinners) == 1 {
		for name, p := range a.deps.Pinners {
			return p, fmt.Errorf("the container runtime answering CRI is %q, but imagepind is configured for %s ([cri] runtime)", runtimeName, name)
		}
	}
	return nil, fmt.Errorf("the container runtime answering CRI is %q: imagepind pins images on cri-o and containerd only; images are pulled but not pinned", runtimeName)
}

// watcher is a pinner that follows the runtime's own events (containerd's image
// events): changed asks for a pass.
type watcher interface {
	Watch(ctx context.Context, changed func()) error
}

// pinsPerRecord says whether the runtime pins image records (containerd: the label is
// set after the pull) rather than names (CRI-O: a pattern pins what is pulled by it).
func (a *Agent) pinsPerRecord() bool {
	_, ok := a.pinner.(interface{ PinsRecords() bool })
	return ok
}
