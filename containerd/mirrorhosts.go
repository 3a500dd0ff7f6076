package containerd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/imagepin/imagepin/internal/fsutil"
	"github.com/imagepin/imagepin/pin"
)

// The node-local mirror's block in a registry's hosts.toml: containerd has no drop-in
// directory for hosts, so imagepind inserts its host (first, before the
// administrator's) into the file containerd reads for that registry, between these
// lines, and takes it out again when the registry's images are no longer pinned or
// [peers] is off. Everything outside them is the administrator's, left as it is.
const (
	blockBegin = "# >>> imagepin: the node-local mirror of pinned images ([peers]); imagepind manages the lines to <<< and removes them when off"
	blockEnd   = "# <<< imagepin"
)

// MirrorPinner is the containerd pinner with the node-local mirror (issue 24): each
// pin write also puts the mirror first in the hosts.toml of every registry a pinned
// image comes from (digest-only: the mirror answers 404 for anything not pinned, and
// containerd goes on to the next host).
type MirrorPinner struct {
	*Pinner
	// Local is the mirror's host:port; ConfigPath containerd's hosts directory.
	Local      string
	ConfigPath string
	// Record is where the registries given a block are kept (state directory).
	Record string
	// Path is how a source registry appears in the mirror's paths (mirror.PathFor).
	Path func(repo string) string
	// OnPins takes the pinned patterns after each write.
	OnPins func([]string)
}

var _ pin.Pinner = (*MirrorPinner)(nil)

// Write writes the pins, then the hosts blocks.
func (m *MirrorPinner) Write(ctx context.Context, patterns []string, images func(string) (bool, bool)) (pin.Written, error) {
	w, err := m.Pinner.Write(ctx, patterns, images)
	if err != nil {
		return w, err
	}
	if m.OnPins != nil {
		m.OnPins(patterns)
	}
	if err := m.SyncHosts(registriesOf(patterns)); err != nil {
		w.Faults = append(w.Faults, "node-local mirror's hosts.toml: "+err.Error())
	}
	return w, nil
}

// registriesOf are the registry hosts of the references among patterns, sorted.
func registriesOf(patterns []string) []string {
	var out []string
	for _, repo := range pin.Repositories(patterns) {
		host, _, _ := strings.Cut(repo, "/")
		if !slices.Contains(out, host) {
			out = append(out, host)
		}
	}
	return out
}

// SyncHosts gives each of registries the mirror's block (once, first), and takes it
// out of the registries it was given before and are not among them now (nil: every
// one, [peers] off). A file it created holding nothing else is removed.
func (m *MirrorPinner) SyncHosts(registries []string) error {
	var had map[string]given // by registry
	if b, err := fsutil.ReadRegular(m.Record, maxHostsFile); err == nil {
		_ = json.Unmarshal(b, &had)
	}
	now := map[string]given{}
	var errs []string
	for _, r := range registries {
		g, err := m.give(r, had[r])
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", r, err))
			continue
		}
		now[r] = g
	}
	for r, g := range had {
		if n, ok := now[r]; ok && n.File == g.File {
			continue
		}
		if err := m.take(g); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", r, err))
			now[r] = g // try again next time
		}
	}
	if len(now) == 0 {
		os.Remove(m.Record)
	} else if b, err := json.Marshal(now); err == nil && !bytes.Equal(b, mustRead(m.Record)) {
		if err := fsutil.WriteAtomic(m.Record, filepath.Dir(m.Record), b, 0o644); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// given is a hosts.toml given the mirror's block: Created when imagepind wrote the
// file (from _default's, or from nothing), so taking the block out removes it.
type given struct {
	File    string `json:"file"`
	Created bool   `json:"created,omitempty"`
}

func mustRead(p string) []byte {
	b, _ := fsutil.ReadRegular(p, maxHostsFile)
	return b
}

// maxHostsFile bounds what is read of a hosts.toml (as readHostDir does).
const maxHostsFile = 1 << 20

// errNoConfigPath: without containerd's hosts directory, every path would be relative
// to imagepind's working directory.
var errNoConfigPath = errors.New("no containerd hosts directory ([containerd] config_path is empty): nothing written")

// readHosts reads a hosts.toml imagepind may rewrite: a regular file (not a symbolic
// link: the link's target may be shared by several registries' directories, or sit on
// a read-only volume, so a registry whose hosts.toml is a link is left as it is), read
// with a bound and without blocking (a FIFO or a device there must not hang the pin
// write). It returns nil and no error when there is no file.
func readHosts(file string) ([]byte, os.FileInfo, error) {
	fi, err := os.Lstat(file)
	if os.IsNotExist(err) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		target, _ := os.Readlink(file)
		return nil, nil, fmt.Errorf("%s is a symbolic link (to %s): imagepind does not write through links; left as it is (make it a regular file for the node-local mirror to be used)", file, target)
	}
	b, err := fsutil.ReadRegular(file, maxHostsFile)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w; left as it is", file, err)
	}
	return b, fi, nil
}

// give writes registry's hosts.toml with the mirror's block first, keeping the rest;
// it returns the file. The file is the one containerd reads for registry: an existing
// host directory's, else a new one that starts from _default's hosts.toml, which it
// would otherwise have used.
func (m *MirrorPinner) give(registry string, before given) (given, error) {
	if m.ConfigPath == "" {
		return given{}, errNoConfigPath
	}
	h := &Hosts{ConfigPath: m.ConfigPath}
	dir, _ := h.find(registry)
	var base []byte
	if dir != "" {
		var err error
		if base, _, err = readHosts(filepath.Join(dir, "hosts.toml")); err != nil {
			return given{}, err
		}
	}
	created := before.Created
	if dir == "" || filepath.Base(dir) == "_default" {
		dir = filepath.Join(m.ConfigPath, registry)
		created = true
	}
	file := filepath.Join(dir, "hosts.toml")
	g := given{File: file, Created: created}
	admin := stripBlock(base)
	// Pull only: containerd asks a host for a reference by digest when it has the pull
	// capability, and only hosts with resolve for a tag (core/remotes/docker/resolver.go
	// Resolve: caps = HostCapabilityPull, |= HostCapabilityResolve without a digest,
	// v2.2.9). The mirror serves digests only, and containerd checks every fetch by
	// digest, so whatever answers on the mirror's port while imagepind is down can fail
	// a pull but never choose the image behind a tag.
	block := fmt.Sprintf("%s\n[host.%q]\n  capabilities = [\"pull\"]\n  override_path = true\n%s\n",
		blockBegin, "http://"+m.Local+"/v2/"+strings.TrimSuffix(m.Path(registry+"/x"), "/x"), blockEnd)
	out := insertBlock(admin, block)
	if bytes.Equal(out, base) {
		return g, nil
	}
	var probe map[string]any
	if _, err := toml.Decode(string(out), &probe); err != nil {
		// The administrator's file does not parse: containerd falls back to the
		// directory's certificate files; leave it as it is.
		return given{}, fmt.Errorf("%s does not parse with the mirror's host in it (%v); left as it is", file, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return given{}, err
	}
	return g, fsutil.WriteAtomic(file, dir, out, 0o644)
}

// take removes the mirror's block from a file, and a file imagepind created when what
// is left is nothing or _default's (which containerd reads again without it).
func (m *MirrorPinner) take(g given) error {
	base, _, err := readHosts(g.File)
	if err != nil || base == nil {
		return err
	}
	admin := stripBlock(base)
	if bytes.Equal(admin, base) {
		return nil
	}
	def, _ := fsutil.ReadRegular(filepath.Join(m.ConfigPath, "_default", "hosts.toml"), maxHostsFile)
	if len(bytes.TrimSpace(admin)) == 0 || (g.Created && bytes.Equal(bytes.TrimSpace(admin), bytes.TrimSpace(def))) {
		err := os.Remove(g.File)
		os.Remove(filepath.Dir(g.File)) // only when empty
		return err
	}
	return fsutil.WriteAtomic(g.File, filepath.Dir(g.File), admin, 0o644)
}

// stripBlock is text without the mirror's block.
func stripBlock(text []byte) []byte {
	lines := strings.SplitAfter(string(text), "\n")
	var out []string
	in := false
	for _, l := range lines {
		t := strings.TrimSpace(l)
		switch {
		case t == blockBegin:
			in = true
		case in && t == blockEnd:
			in = false
		case !in:
			out = append(out, l)
		}
	}
	return []byte(strings.Join(out, ""))
}

// insertBlock puts block before the first [host…] table of admin (containerd tries the
// hosts in file order, the server last), or at the end when there is none: the
// administrator's top-level keys stay above it.
func insertBlock(admin []byte, block string) []byte {
	lines := strings.SplitAfter(string(admin), "\n")
	at := slices.IndexFunc(lines, func(l string) bool {
		t := strings.TrimSpace(l)
		return strings.HasPrefix(t, "[host.") || strings.HasPrefix(t, "[host ") || strings.HasPrefix(t, "[ host")
	})
	if at < 0 {
		s := string(admin)
		if s != "" && !strings.HasSuffix(s, "\n") {
			s += "\n"
		}
		return []byte(s + block)
	}
	return []byte(strings.Join(lines[:at], "") + block + strings.Join(lines[at:], ""))
}
