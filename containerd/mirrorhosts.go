package containerd

import (
	"bytes"
	"context"
	"encoding/json"
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
	if b, err := os.ReadFile(m.Record); err == nil {
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
	b, _ := os.ReadFile(p)
	return b
}

// give writes registry's hosts.toml with the mirror's block first, keeping the rest;
// it returns the file. The file is the one containerd reads for registry: an existing
// host directory's, else a new one that starts from _default's hosts.toml, which it
// would otherwise have used.
func (m *MirrorPinner) give(registry string, before given) (given, error) {
	h := &Hosts{ConfigPath: m.ConfigPath}
	dir, _ := h.find(registry)
	var base []byte
	if dir != "" {
		base, _ = os.ReadFile(filepath.Join(dir, "hosts.toml"))
	}
	created := before.Created
	if dir == "" || filepath.Base(dir) == "_default" {
		dir = filepath.Join(m.ConfigPath, registry)
		created = true
	}
	file := filepath.Join(dir, "hosts.toml")
	g := given{File: file, Created: created}
	admin := stripBlock(base)
	block := fmt.Sprintf("%s\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n  override_path = true\n%s\n",
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
	base, err := os.ReadFile(g.File)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	admin := stripBlock(base)
	if bytes.Equal(admin, base) {
		return nil
	}
	def, _ := os.ReadFile(filepath.Join(m.ConfigPath, "_default", "hosts.toml"))
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
