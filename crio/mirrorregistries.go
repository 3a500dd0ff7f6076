package crio

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.podman.io/image/v5/pkg/sysregistriesv2"

	"github.com/imagepin/imagepin/internal/fsutil"
	"github.com/imagepin/imagepin/pin"
)

// MirrorRegistries is the registries.conf.d drop-in of the node-local mirror: it puts the mirror first for the repositories of the pinned images
// (MirrorDropIn). A changed drop-in asks for CRI-O's reload (SIGHUP, on which CRI-O
// re-reads registries.conf.d too), so the same reload applies the pins and the drop-in.
// It is rendered after each pin write (peers.Node.Pinner).
type MirrorRegistries struct {
	// Local is the mirror's host:port.
	Local string
	// Tags, when set, is the mirror's TLS endpoint for pinned tags (host:port): the
	// first mirror, for tags only (tagEndpoint), of each repository whose pulls CRI-O
	// verifies TLS on that endpoint for: every repository from CRI-O 1.35
	// (Support.TLSPerEndpoint), before it those whose registry CRI-O does not hold
	// insecure (VerifiesTLS, given Insecure).
	Tags string
	// Version is CRI-O's version (CRI Version); nil: taken for one before 1.35. Insecure
	// is CRI-O's insecure_registries as it has them (LiveConfig), read only for a CRI-O
	// before 1.35; nil: none. Either not readable, no repository gets the tag endpoint
	// until the next render.
	Version  func(ctx context.Context) (string, error)
	Insecure func(ctx context.Context) ([]string, error)
	// Admin are CRI-O's registries files as the administrator wrote them; the drop-in
	// goes into Admin.Dir.
	Admin *AdminFiles
	// Path is how the mirror names a source repository in its paths.
	Path func(repo string) string
	// Originals, when set, records what the drop-in's path held before imagepind first
	// writes it, for uninstall.
	Originals Originals

	// lastRepos and last are the inputs and the drop-in of the last render: with the
	// same repositories and unchanged administrator's files, nothing is rendered again.
	lastRepos []string
	last      []byte
	// lastInsecure are CRI-O's insecure registries at the last render, lastPerEndpoint
	// whether it verified each endpoint on its own.
	lastInsecure    []string
	lastPerEndpoint bool
}

// Render writes the drop-in for patterns, the pins just written (removes it when they
// name no repository); changed says CRI-O must reload.
func (m *MirrorRegistries) Render(patterns []string) (changed bool, err error) {
	changed, err = m.writeDropIn(patterns)
	if err != nil {
		return false, fmt.Errorf("node-local mirror's registries drop-in: %w", err)
	}
	return changed, nil
}

func (m *MirrorRegistries) writeDropIn(patterns []string) (bool, error) {
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
	tags, insecure, perEndpoint, known := m.tagEndpoints()
	data := m.last
	if adminChanged || !slices.Equal(repos, m.lastRepos) || !slices.Equal(insecure, m.lastInsecure) || perEndpoint != m.lastPerEndpoint || !known {
		if data, err = mirrorDropIn(m.Local, tags, repos, admin, m.Path); err != nil {
			return false, err
		}
		m.lastRepos, m.last, m.lastInsecure, m.lastPerEndpoint = repos, data, insecure, perEndpoint
		if !known {
			m.lastRepos = nil // CRI-O's insecure registries not known: render again next time
		}
	}
	if bytes.Equal(old, data) {
		return false, nil
	}
	if err := keep(m.Originals, path); err != nil {
		return false, err
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

// tagEndpoints is which repository gets the tag endpoint (nil: none), with what it was
// decided on: CRI-O's insecure registries (before 1.35), or perEndpoint (from 1.35,
// every repository); known false when CRI-O's version or its insecure registries could
// not be read.
func (m *MirrorRegistries) tagEndpoints() (tags func(repo string) string, insecure []string, perEndpoint, known bool) {
	if m.Tags == "" {
		return nil, nil, false, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if m.Version != nil {
		v, err := m.Version(ctx)
		if err != nil {
			return nil, nil, false, false
		}
		if sup, _ := SupportOf(v); sup.TLSPerEndpoint { // unparsable: taken for current, as SupportOf does
			return func(string) string { return m.Tags }, nil, true, true
		}
	}
	if m.Insecure != nil {
		var err error
		if insecure, err = m.Insecure(ctx); err != nil {
			return nil, nil, false, false
		}
	}
	verified := map[string]bool{}
	return func(repo string) string {
		host, _, _ := strings.Cut(repo, "/")
		v, ok := verified[host]
		if !ok {
			v = VerifiesTLS(context.Background(), host, insecure)
			verified[host] = v
		}
		if !v {
			return ""
		}
		return m.Tags
	}, insecure, false, true
}

// tagEndpoint is the mirror entry of the tag endpoint at hostPort for repo: tags only
// (a digest is checked by the client whoever serves it; a tag is not), and never
// insecure: containers/image then speaks TLS only, verifying the endpoint's certificate
// against the CA in certs.d/<hostPort>/ca.crt (package tags/endpoint), so no other process
// bound to that port is believed. A refused connection or a failed handshake makes it go
// on to the next endpoint; the endpoint's 404 for a tag no set pins does the same.
func tagEndpoint(hostPort, repo string, path func(string) string) sysregistriesv2.Endpoint {
	return sysregistriesv2.Endpoint{Location: hostPort + "/" + path(repo), PullFromMirror: sysregistriesv2.MirrorByTagOnly}
}
