package agent

import (
	"fmt"
	"sort"

	"github.com/imagepin/imagepin/pin"
)

// pinners lists the configured pinners, in name order.
func (a *Agent) pinners() []pin.Pinner {
	names := make([]string, 0, len(a.deps.Pinners))
	for n := range a.deps.Pinners {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]pin.Pinner, 0, len(names))
	for _, n := range names {
		out = append(out, a.deps.Pinners[n])
	}
	return out
}

// choosePinner picks the pinner for the runtime that answered CRI. With one configured
// ([cri] runtime named), it is the one whatever answers, and another runtime is a
// fault; with several (auto), the runtime's name decides.
func (a *Agent) choosePinner(runtimeName string) (pin.Pinner, error) {
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

// pinsPerRecord says whether the runtime pins image records (containerd: the label is
// set after the pull) rather than names (CRI-O: a pattern pins what is pulled by it).
func (a *Agent) pinsPerRecord() bool { return a.rt.pinner != nil && pin.PinsRecords(a.rt.pinner) }
