package containerd

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

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

// MirrorHosts are the node-local mirror's blocks in containerd's hosts.toml files
// (peers): rendered after each pin write (peers.Node.Pinner), they put the mirror
// first in the hosts.toml of every registry a pinned image comes from (digest-only: the
// mirror answers 404 for anything not pinned, and containerd goes on to the next host).
type MirrorHosts struct {
	// Local is the mirror's host:port; ConfigPath containerd's hosts directory.
	Local      string
	ConfigPath string
	// Record is where the registries given a block are kept (state directory).
	Record string
	// Path is how a source registry appears in the mirror's paths (mirror.PathFor).
	Path func(repo string) string
	// Originals, when set, records what a hosts.toml held (the administrator's bytes,
	// mode and owner, or no file) before imagepind first writes it, for uninstall.
	Originals Originals
}

// Originals records what a path held before imagepind first changes it
// (original.Book.Keep); an error leaves the path as it is.
type Originals interface {
	Keep(path string) error
}

// Render gives the registries of patterns, the pins just written, the mirror's block
// and takes it out of the others (SyncHosts). containerd reads hosts.toml at each pull:
// nothing is to be reloaded, changed is always false.
func (m *MirrorHosts) Render(patterns []string) (changed bool, err error) {
	if err := m.SyncHosts(registriesOf(patterns)); err != nil {
		return false, fmt.Errorf("node-local mirror's hosts.toml: %w", err)
	}
	return false, nil
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
func (m *MirrorHosts) SyncHosts(registries []string) error {
	var had map[string]given // by registry
	if b, err := fsutil.ReadRegular(m.Record, maxHostsFile); err == nil {
		_ = json.Unmarshal(b, &had)
	}
	now := map[string]given{}
	var errs []string
	for _, r := range registries {
		g, err := m.give(r)
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

// given is a hosts.toml given the mirror's block. Created is kept for records of
// earlier versions, which made files without the mark (madeFromDefault).
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

// The first line of a hosts.toml imagepind made, where containerd read none for the
// registry: from _default's (a new directory <registry>/, as containerd would otherwise
// have used _default), or in the registry's directory that holds only certificate
// files. Such a file is imagepind's: made again from its source at each pin write (so
// it follows _default), and removed when the block goes, whatever _default holds by
// then. Without this line it is the administrator's.
const (
	madeFromDefault = "# imagepin: imagepind made this file and its directory from _default for the node-local mirror, and removes them when the mirror's block goes. Delete this line to keep the file as your own."
	madeFromCerts   = "# imagepin: imagepind made this file from the certificate files beside it for the node-local mirror, and removes it when the mirror's block goes. Delete this line to keep the file as your own."
)

func madeBy(text []byte) string {
	first, _, _ := strings.Cut(string(text), "\n")
	switch first = strings.TrimSpace(first); first {
	case madeFromDefault, madeFromCerts:
		return first
	}
	return ""
}

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
	if b == nil {
		b = []byte{}
	}
	return b, fi, nil
}

// perms are a file's mode bits and owner (uid -1: imagepind's own).
type perms struct {
	mode     os.FileMode
	uid, gid int
}

var newFile = perms{mode: 0o644, uid: -1, gid: -1}

func permsOf(fi os.FileInfo) perms {
	p := perms{mode: fi.Mode().Perm(), uid: -1, gid: -1}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		p.uid, p.gid = int(st.Uid), int(st.Gid)
	}
	return p
}

// writeHosts replaces file atomically with the mode and owner of p: a hosts.toml may
// hold credentials (header = {Authorization = …}) and be readable by root alone.
func writeHosts(file string, data []byte, p perms) error {
	if err := fsutil.WriteAtomic(file, filepath.Dir(file), data, p.mode); err != nil {
		return err
	}
	if p.uid >= 0 {
		return os.Chown(file, p.uid, p.gid)
	}
	return nil
}

// give writes registry's hosts.toml with the mirror's block first, keeping the rest;
// it returns the file. The file is the one containerd reads for registry: its host
// directory's hosts.toml; where there is none, one imagepind makes (madeBy) holding what
// containerd used without it, so that adding the mirror changes nothing else.
func (m *MirrorHosts) give(registry string) (given, error) {
	if m.ConfigPath == "" {
		return given{}, errNoConfigPath
	}
	h := &Hosts{ConfigPath: m.ConfigPath}
	dir, _ := h.find(registry)
	own := dir != "" && filepath.Base(dir) != "_default"
	if !own {
		dir = filepath.Join(m.ConfigPath, registry)
	}
	file := filepath.Join(dir, "hosts.toml")
	base, fi, err := readHosts(file)
	if err != nil {
		return given{}, err
	}
	// Pull only: containerd asks a host for a reference by digest when it has the pull
	// capability, and only hosts with resolve for a tag (core/remotes/docker/resolver.go
	// Resolve: caps = HostCapabilityPull, |= HostCapabilityResolve without a digest,
	// v2.2.9). The mirror serves digests only, and containerd checks every fetch by
	// digest, so whatever answers on the mirror's port while imagepind is down can fail
	// a pull but never choose the image behind a tag.
	block := fmt.Sprintf("%s\n[host.%q]\n  capabilities = [\"pull\"]\n  override_path = true\n%s\n",
		blockBegin, "http://"+m.Local+"/v2/"+strings.TrimSuffix(m.Path(registry+"/x"), "/x"), blockEnd)
	var out []byte
	var want perms
	made := madeBy(base)
	if len(base) > 0 && made == "" {
		out, want = insertBlock(stripBlock(base), block), permsOf(fi)
	} else {
		// containerd reads an empty hosts.toml as none (loadHostDir: len(b) == 0).
		if made == "" {
			made = madeFromCerts
			if !own {
				made = madeFromDefault
			}
		}
		text, p, err := m.madeText(made, dir)
		if err != nil {
			return given{}, err
		}
		out, want = insertBlock(text, block), p
		if want == newFile && fi != nil {
			want = permsOf(fi) // the administrator's chmod or chown of it kept
		}
	}
	g := given{File: file, Created: made != ""}
	if fi != nil && bytes.Equal(out, base) && (want.uid < 0 || permsOf(fi) == want) && fi.Mode().Perm() == want.mode {
		return g, nil
	}
	var probe map[string]any
	if _, err := toml.Decode(string(out), &probe); err != nil {
		// The administrator's file does not parse: containerd falls back to the
		// directory's certificate files; leave it as it is.
		return given{}, fmt.Errorf("%s does not parse with the mirror's host in it (%v); left as it is", file, err)
	}
	if m.Originals != nil {
		if err := m.Originals.Keep(file); err != nil {
			return given{}, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return given{}, err
	}
	return g, writeHosts(file, out, want)
}

// madeText is what a hosts.toml imagepind makes holds above the mirror's block, and the
// mode and owner it gets: what containerd (core/remotes/docker/config/hosts.go, v2.2.9)
// used for the registry without it.
//   - From _default: _default/hosts.toml (its mode and owner: it may hold credentials),
//     with relative ca and client paths made absolute (containerd resolves them against
//     the directory of the hosts.toml, makeAbsPath: a copy in <registry>/ would name
//     files that are not there, and containerd refuses to configure the registry).
//     Without one, _default's certificate files, as below.
//   - From certificate files: containerd reads a directory without hosts.toml Docker's
//     way (loadCertFiles: *.crt CA files, *.cert client certificates with the *.key of
//     the same name, else the key in the .cert) for the default server, and no longer
//     once a hosts.toml is there (loadHostDir). The made file names them at its top
//     level, without a server: containerd's default server gets them, as before.
func (m *MirrorHosts) madeText(made, dir string) ([]byte, perms, error) {
	head := made + "\n"
	src := dir
	if made == madeFromDefault {
		src = filepath.Join(m.ConfigPath, "_default")
		if _, err := os.Stat(src); os.IsNotExist(err) {
			return []byte(head), newFile, nil
		}
		file := filepath.Join(src, "hosts.toml")
		text, err := fsutil.ReadRegular(file, maxHostsFile)
		if err != nil && !os.IsNotExist(err) {
			return nil, perms{}, fmt.Errorf("%s: %w; the registry is left to it", file, err)
		}
		if len(text) > 0 {
			fi, err := os.Stat(file)
			if err != nil {
				return nil, perms{}, err
			}
			abs, err := absolutePaths(text, src)
			if err != nil {
				return nil, perms{}, fmt.Errorf("%s does not parse (%v): containerd falls back to its directory's certificate files; the registry is left to it", file, err)
			}
			return append([]byte(head), abs...), permsOf(fi), nil
		}
	}
	certs, err := certKeys(src)
	if err != nil {
		return nil, perms{}, err
	}
	return append([]byte(head), certs...), newFile, nil
}

// certKeys are the top-level ca and client keys naming dir's certificate files as
// containerd's loadCertFiles reads them ("" when there are none).
func certKeys(dir string) ([]byte, error) {
	ep := certFiles(dir)[0]
	doc := map[string]any{}
	if len(ep.ca) > 0 {
		doc["ca"] = ep.ca
	}
	var client []any
	for _, pair := range ep.client {
		if pair[1] == "" {
			client = append(client, pair[0]) // the key in the .cert file
		} else {
			client = append(client, []any{pair[0], pair[1]})
		}
	}
	if len(client) > 0 {
		doc["client"] = client
	}
	if len(doc) == 0 {
		return nil, nil
	}
	var b bytes.Buffer
	b.WriteString("# containerd's certificate files of " + dir + " (it reads them only while there is no hosts.toml)\n")
	if err := toml.NewEncoder(&b).Encode(doc); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// absolutePaths is a hosts.toml of dir that means the same in another directory: the
// text as it is when no ca or client path is relative; else the file written anew
// (comments and unknown keys, which containerd ignores, left out) with those paths
// joined to dir, the hosts in their order.
func absolutePaths(text []byte, dir string) ([]byte, error) {
	var doc map[string]any
	md, err := toml.Decode(string(text), &doc)
	if err != nil {
		return nil, err
	}
	relative := false
	abs := func(v any) any { return mapPaths(v, dir, &relative) }
	top := map[string]any{}
	for k, v := range doc {
		switch k {
		case "host":
		case "ca", "client":
			top[k] = abs(v)
		default:
			top[k] = v
		}
	}
	hosts, _ := doc["host"].(map[string]any)
	var order []string
	for _, k := range md.Keys() {
		if len(k) >= 2 && k[0] == "host" && !slices.Contains(order, k[1]) {
			order = append(order, k[1])
		}
	}
	tables := map[string]map[string]any{}
	for _, name := range order {
		fields, _ := hosts[name].(map[string]any)
		t := map[string]any{}
		for k, v := range fields {
			if k == "ca" || k == "client" {
				v = abs(v)
			}
			t[k] = v
		}
		tables[name] = t
	}
	if !relative {
		return text, nil
	}
	var b bytes.Buffer
	b.WriteString("# _default/hosts.toml (" + dir + "), its relative ca and client paths made absolute\n")
	enc := toml.NewEncoder(&b)
	enc.Indent = "  "
	if err := enc.Encode(top); err != nil {
		return nil, err
	}
	for _, name := range order {
		var t bytes.Buffer
		enc := toml.NewEncoder(&t)
		enc.Indent = "  "
		if err := enc.Encode(map[string]any{"host": map[string]any{name: tables[name]}}); err != nil {
			return nil, err
		}
		// The encoder opens the [host] table each time; once per file is all TOML allows,
		// and an implicit one is enough.
		table := strings.Replace(strings.TrimLeft(t.String(), "\n"), "[host]\n", "", 1)
		b.WriteString("\n")
		for _, l := range strings.SplitAfter(table, "\n") {
			b.WriteString(strings.TrimPrefix(l, enc.Indent))
		}
	}
	return b.Bytes(), nil
}

// mapPaths joins the relative paths in a ca or client value (a string, a list of them,
// or of [cert, key] pairs) to dir, as containerd's makeAbsPath does.
func mapPaths(v any, dir string, relative *bool) any {
	switch v := v.(type) {
	case string:
		if !filepath.IsAbs(v) {
			*relative = true
			return filepath.Join(dir, v)
		}
		return v
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = mapPaths(e, dir, relative)
		}
		return out
	}
	return v
}

// take removes the mirror's block from a file, and a file imagepind made (madeBy)
// altogether, with the directory it made.
func (m *MirrorHosts) take(g given) error {
	base, fi, err := readHosts(g.File)
	if err != nil || base == nil {
		return err
	}
	switch madeBy(base) {
	case madeFromDefault:
		if err := fsutil.RemoveDurable(g.File); err != nil {
			return err
		}
		os.Remove(filepath.Dir(g.File)) // only when empty
		return nil
	case madeFromCerts:
		return fsutil.RemoveDurable(g.File)
	}
	admin := stripBlock(base)
	if bytes.Equal(admin, base) {
		return nil
	}
	if g.Created && len(bytes.TrimSpace(admin)) == 0 {
		// Made by an earlier imagepind, before the mark, from nothing.
		return fsutil.RemoveDurable(g.File)
	}
	return writeHosts(g.File, admin, permsOf(fi))
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

// WithoutMirror is a hosts.toml's text without what imagepind put in it: nil when
// imagepind made the file (madeBy), else the text without the mirror's block.
func WithoutMirror(text []byte) []byte {
	if madeBy(text) != "" {
		return nil
	}
	return stripBlock(text)
}
