package peers

import (
	"context"

	"github.com/imagepin/imagepin/pin"
)

// Files are the runtime's files that point it at the node-local mirror for the images
// pinned: CRI-O's registries drop-in (crio.MirrorRegistries), the mirror's blocks in
// containerd's hosts.toml files (containerd.MirrorHosts).
type Files interface {
	// Render writes them for patterns, the pins just written. changed says the
	// runtime must re-read its configuration (pin.Pinner's Apply); an error is a fault
	// of the node that never fails the pins.
	Render(patterns []string) (changed bool, err error)
}

// Pinner is p with the node-local mirror: each successful write of the pins tells the
// mirror what it may serve, then renders files, in that order (the runtime is pointed
// at the mirror only once the mirror serves what it will ask for). Every capability of
// p (pin.Watcher, pin.RecordPinner) is kept.
func (n *Node) Pinner(p pin.Pinner, files Files) pin.Pinner {
	return pin.Decorated(&mirrorPinner{Pinner: p, node: n, files: files}, p)
}

type mirrorPinner struct {
	pin.Pinner
	node  *Node
	files Files
}

func (m *mirrorPinner) Write(ctx context.Context, patterns []string, images func(string) (bool, bool)) (pin.Written, error) {
	w, err := m.Pinner.Write(ctx, patterns, images)
	if err != nil {
		return w, err
	}
	m.node.setPinned(patterns)
	changed, err := m.files.Render(patterns)
	if err != nil {
		w.Faults = append(w.Faults, err.Error())
		return w, nil
	}
	w.Changed = w.Changed || changed
	return w, nil
}
