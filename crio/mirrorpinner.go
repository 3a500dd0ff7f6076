package crio

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"

	"go.podman.io/image/v5/pkg/sysregistriesv2"

	"github.com/imagepin/imagepin/internal/fsutil"
	"github.com/imagepin/imagepin/pin"
)

// MirrorPinner is the CRI-O pinner with the node-local mirror (issue 24): each pin
// write also writes the registries.conf.d drop-in that puts the mirror first for the
// repositories of the pinned images (MirrorDropIn), and tells the mirror what it may
// serve. A changed drop-in counts as a change, so the same reload (SIGHUP, on which
// CRI-O re-reads registries.conf.d too) applies both.
type MirrorPinner struct {
	*Pinner
	// Local is the mirror's host:port.
	Local string
	// Admin are CRI-O's registries files as the administrator wrote them; the drop-in
	// goes into Admin.Dir.
	Admin *AdminFiles
	// OnPins receives the pinned references at each write.
	OnPins func(refs []string)
	// Path is how the mirror names a source repository in its paths.
	Path func(repo string) string

	// lastRepos and last are the inputs and the drop-in of the last render: with the
	// same repositories and unchanged administrator's files, nothing is rendered again.
	lastRepos []string
	last      []byte
}

var _ pin.Pinner = (*MirrorPinner)(nil)

// Write writes the pins, then the mirror drop-in.
func (m *MirrorPinner) Write(ctx context.Context, patterns []string, images func(string) (bool, bool)) (pin.Written, error) {
	w, err := m.Pinner.Write(ctx, patterns, images)
	if err != nil {
		return w, err
	}
	if m.OnPins != nil {
		m.OnPins(patterns)
	}
	changed, err := m.writeDropIn(patterns)
	if err != nil {
		w.Faults = append(w.Faults, "node-local mirror's registries drop-in: "+err.Error())
		return w, nil
	}
	w.Changed = w.Changed || changed
	return w, nil
}

func (m *MirrorPinner) writeDropIn(patterns []string) (bool, error) {
	path := filepath.Join(m.Admin.Dir, MirrorDropInName)
	repos := pin.Repositories(patterns)
	old, _ := os.ReadFile(path)
	if len(repos) == 0 {
		m.lastRepos, m.last = nil, nil
		if old == nil {
			return false, nil
		}
		err := os.Remove(path)
		sysregistriesv2.InvalidateCache()
		return true, err
	}
	admin, adminChanged, err := m.Admin.Read()
	if err != nil {
		return false, err
	}
	data := m.last
	if adminChanged || !slices.Equal(repos, m.lastRepos) {
		if data, err = MirrorDropIn(m.Local, repos, admin, m.Path); err != nil {
			return false, err
		}
		m.lastRepos, m.last = repos, data
	}
	if bytes.Equal(old, data) {
		return false, nil
	}
	if err := os.MkdirAll(m.Admin.Dir, 0o755); err != nil {
		return false, err
	}
	// The temp file outside the directory: containers/image reads every *.conf there.
	if err := fsutil.WriteAtomic(path, filepath.Dir(m.Admin.Dir), data, 0o644); err != nil {
		return false, err
	}
	// imagepind's own registry access (the disk check) reads these files too, through
	// containers/image's cache of them.
	sysregistriesv2.InvalidateCache()
	return true, nil
}
