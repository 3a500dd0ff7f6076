package containerd

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func pathFor(repo string) string {
	host, rest, _ := strings.Cut(repo, "/")
	return strings.Replace(host, ":", "_", 1) + "/" + rest
}

// The mirror's host goes first in the hosts.toml containerd reads for each registry of a
// pinned image, the administrator's lines kept as they are; taken out, the files are
// as they were (a file imagepind created is removed).
func TestMirrorHostsFirstAndRemovedAgain(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "certs.d")
	admin := "server = \"https://registry.example:5000\"\n\n[host.\"https://mirror.example\"]\n  capabilities = [\"pull\"]\n"
	def := "[host.\"https://default-mirror.example\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
	for d, text := range map[string]string{"registry.example_5000_": admin, "_default": def} {
		os.MkdirAll(filepath.Join(conf, d), 0o755)
		os.WriteFile(filepath.Join(conf, d, "hosts.toml"), []byte(text), 0o644)
	}
	m := &MirrorHosts{Local: "127.0.0.1:7443", ConfigPath: conf, Record: filepath.Join(dir, "record.json"), Path: pathFor}
	if err := m.SyncHosts([]string{"registry.example:5000", "quay.io"}); err != nil {
		t.Fatal(err)
	}
	// The administrator's registry: ours first, then theirs, then the server.
	eps, _, err := readHostDir(filepath.Join(conf, "registry.example_5000_"))
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 3 || eps[0].host != "127.0.0.1:7443" || eps[0].path != "override:/v2/registry.example_5000" || eps[1].host != "mirror.example" || eps[2].host != "registry.example:5000" {
		t.Fatalf("endpoints %+v", eps)
	}
	// quay.io had only _default: a new directory, _default's mirror kept after ours.
	eps, _, err = readHostDir(filepath.Join(conf, "quay.io"))
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 3 || eps[0].host != "127.0.0.1:7443" || eps[1].host != "default-mirror.example" {
		t.Fatalf("quay.io endpoints %+v", eps)
	}
	// Written again with nothing changed: no change.
	before, _ := os.ReadFile(filepath.Join(conf, "registry.example_5000_", "hosts.toml"))
	if err := m.SyncHosts([]string{"registry.example:5000", "quay.io"}); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(filepath.Join(conf, "registry.example_5000_", "hosts.toml"))
	if string(before) != string(after) || strings.Count(string(after), blockBegin) != 1 {
		t.Fatalf("a second write changed the file:\n%s", after)
	}
	// The disk check's translation follows the mirror's path; the mirror's own leaves it out.
	h := &Hosts{ConfigPath: conf, Dir: filepath.Join(dir, "t1")}
	c, _, _ := h.Files("registry.example:5000/ns/app")
	text, _ := os.ReadFile(c)
	if !strings.Contains(string(text), `location = "127.0.0.1:7443/registry.example_5000"`) {
		t.Fatalf("the translation does not reach the mirror:\n%s", text)
	}
	h = &Hosts{ConfigPath: conf, Dir: filepath.Join(dir, "t2"), Skip: "127.0.0.1:7443"}
	c, _, _ = h.Files("registry.example:5000/ns/app")
	text, _ = os.ReadFile(c)
	if strings.Contains(string(text), "127.0.0.1:7443") || !strings.Contains(string(text), "mirror.example") {
		t.Fatalf("the mirror's own access goes through the mirror:\n%s", text)
	}
	// Off: the administrator's file as it was; the created one gone.
	if err := m.SyncHosts(nil); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(conf, "registry.example_5000_", "hosts.toml"))
	if string(got) != admin {
		t.Fatalf("the administrator's file after the mirror left:\n%q\nwant\n%q", got, admin)
	}
	if _, err := os.Stat(filepath.Join(conf, "quay.io", "hosts.toml")); !os.IsNotExist(err) {
		t.Fatalf("the file imagepind created is still there: %v", err)
	}
	if _, err := os.Stat(m.Record); !os.IsNotExist(err) {
		t.Fatal("the record is still there")
	}
}

// An administrator's file that does not parse is left as it is, with a fault.
func TestMirrorHostsLeaveABrokenFile(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "certs.d")
	os.MkdirAll(filepath.Join(conf, "quay.io"), 0o755)
	broken := "server = \"https://quay.io\n"
	os.WriteFile(filepath.Join(conf, "quay.io", "hosts.toml"), []byte(broken), 0o644)
	m := &MirrorHosts{Local: "127.0.0.1:7443", ConfigPath: conf, Record: filepath.Join(dir, "record.json"), Path: pathFor}
	err := m.SyncHosts([]string{"quay.io"})
	if err == nil || !strings.Contains(err.Error(), "does not parse") {
		t.Fatalf("error %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(conf, "quay.io", "hosts.toml")); string(got) != broken {
		t.Fatalf("the broken file was changed:\n%s", got)
	}
}

// newMirror is a MirrorHosts over a fresh hosts directory.
func newMirror(t *testing.T) (*MirrorHosts, string) {
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "certs.d")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	return &MirrorHosts{Local: "127.0.0.1:7443", ConfigPath: conf, Record: filepath.Join(dir, "record.json"), Path: pathFor}, conf
}

func put(t *testing.T, file, text string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(text), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(file, mode); err != nil {
		t.Fatal(err)
	}
}

// Without containerd's hosts directory nothing is written (before, <registry>/hosts.toml
// landed relative to the working directory).
func TestMirrorHostsWriteNothingWithoutConfigPath(t *testing.T) {
	m, _ := newMirror(t)
	m.ConfigPath = ""
	wd := t.TempDir()
	t.Chdir(wd)
	err := m.SyncHosts([]string{"quay.io"})
	if err == nil || !strings.Contains(err.Error(), "config_path") {
		t.Fatalf("error %v", err)
	}
	if entries, _ := os.ReadDir(wd); len(entries) != 0 {
		t.Fatalf("written into the working directory: %v", entries)
	}
}

// The mirror's host may be asked for digests only: whatever listens on its port while
// imagepind is down must not answer tag resolution.
func TestMirrorHostsPullOnly(t *testing.T) {
	m, conf := newMirror(t)
	if err := m.SyncHosts([]string{"quay.io"}); err != nil {
		t.Fatal(err)
	}
	eps, _, err := readHostDir(filepath.Join(conf, "quay.io"))
	if err != nil {
		t.Fatal(err)
	}
	if eps[0].host != "127.0.0.1:7443" || !eps[0].pull || eps[0].resolve {
		t.Fatalf("the mirror's host: %+v", eps[0])
	}
}

// A FIFO, or a link to /dev/zero, as hosts.toml costs a fault, not a hung pin write.
func TestMirrorHostsNotARegularFile(t *testing.T) {
	for name, mk := range map[string]func(file string) error{
		"fifo":      func(file string) error { return unix.Mkfifo(file, 0o644) },
		"/dev/zero": func(file string) error { return os.Symlink("/dev/zero", file) },
	} {
		t.Run(name, func(t *testing.T) {
			m, conf := newMirror(t)
			os.MkdirAll(filepath.Join(conf, "quay.io"), 0o755)
			file := filepath.Join(conf, "quay.io", "hosts.toml")
			if err := mk(file); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- m.SyncHosts([]string{"quay.io"}) }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), "left as it is") {
					t.Fatalf("error %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the pin write hangs on hosts.toml")
			}
			if fi, err := os.Lstat(file); err != nil || fi.Mode().IsRegular() {
				t.Fatalf("hosts.toml replaced: %v %v", fi.Mode(), err)
			}
		})
	}
}

// A hosts.toml that is a symbolic link is left as it is, with a fault: its target may be
// shared by other registries' directories, or sit on a read-only volume.
func TestMirrorHostsLeaveASymlink(t *testing.T) {
	m, conf := newMirror(t)
	target := filepath.Join(t.TempDir(), "shared-hosts.toml")
	text := "server = \"https://quay.io\"\n"
	put(t, target, text, 0o644)
	os.MkdirAll(filepath.Join(conf, "quay.io"), 0o755)
	link := filepath.Join(conf, "quay.io", "hosts.toml")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	err := m.SyncHosts([]string{"quay.io"})
	if err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("error %v", err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the link was replaced: %v", err)
	}
	if b, _ := os.ReadFile(target); string(b) != text {
		t.Fatalf("the link's target changed:\n%s", b)
	}
}

func modeOwner(t *testing.T, file string) (os.FileMode, uint32, uint32) {
	t.Helper()
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return fi.Mode().Perm(), st.Uid, st.Gid
}

// A hosts.toml holding credentials keeps its mode and owner through the block's coming
// and going (before, it became 0644 and root's); a copy of _default's gets _default's.
func TestMirrorHostsKeepModeAndOwner(t *testing.T) {
	m, conf := newMirror(t)
	secret := "server = \"https://quay.io\"\n\n[host.\"https://mirror.example\"]\n  capabilities = [\"pull\"]\n  [host.\"https://mirror.example\".header]\n    Authorization = \"Basic c2VjcmV0\"\n"
	own := filepath.Join(conf, "quay.io", "hosts.toml")
	def := filepath.Join(conf, "_default", "hosts.toml")
	put(t, own, secret, 0o600)
	put(t, def, secret, 0o640)
	uid, gid := os.Getuid(), os.Getgid()
	if uid == 0 {
		uid, gid = 4321, 8765 // as root, an owner other than imagepind's
		for _, f := range []string{own, def} {
			if err := os.Chown(f, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(file string, mode os.FileMode) {
		t.Helper()
		if m, u, g := modeOwner(t, file); m != mode || int(u) != uid || int(g) != gid {
			t.Fatalf("%s: mode %v owner %d:%d, want %v %d:%d", file, m, u, g, mode, uid, gid)
		}
	}
	if err := m.SyncHosts([]string{"quay.io", "ghcr.io"}); err != nil {
		t.Fatal(err)
	}
	check(own, 0o600)
	check(filepath.Join(conf, "ghcr.io", "hosts.toml"), 0o640)
	if b, _ := os.ReadFile(own); !strings.Contains(string(b), blockBegin) {
		t.Fatalf("no block:\n%s", b)
	}
	if err := m.SyncHosts(nil); err != nil {
		t.Fatal(err)
	}
	check(own, 0o600)
	if b, _ := os.ReadFile(own); string(b) != secret {
		t.Fatalf("after the block went:\n%s", b)
	}
}

// A file imagepind made from _default is known by its mark, not by being _default's
// copy: it follows _default while pinned and is removed after a change of _default (the
// copy stayed before), and by an imagepind without config_path ([peers] off).
func TestMirrorHostsMadeFilesRemovedByTheirMark(t *testing.T) {
	m, conf := newMirror(t)
	def := filepath.Join(conf, "_default", "hosts.toml")
	put(t, def, "[host.\"https://one.example\"]\n", 0o644)
	if err := m.SyncHosts([]string{"quay.io"}); err != nil {
		t.Fatal(err)
	}
	made := filepath.Join(conf, "quay.io", "hosts.toml")
	put(t, def, "[host.\"https://two.example\"]\n", 0o644)
	if err := m.SyncHosts([]string{"quay.io"}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(made); !strings.Contains(string(b), "two.example") || strings.Contains(string(b), "one.example") {
		t.Fatalf("the made file does not follow _default:\n%s", b)
	}
	put(t, def, "[host.\"https://three.example\"]\n", 0o644)
	off := &MirrorHosts{Record: m.Record} // as [peers] off builds it
	if err := off.SyncHosts(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(conf, "quay.io")); !os.IsNotExist(err) {
		t.Fatalf("the made file or its directory is still there: %v", err)
	}
	if b, _ := os.ReadFile(def); !strings.Contains(string(b), "three.example") {
		t.Fatalf("_default changed:\n%s", b)
	}
	// Without the mark the file is the administrator's: only the block goes.
	if err := m.SyncHosts([]string{"quay.io"}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(made)
	kept := string(b)
	if first, rest, _ := strings.Cut(kept, "\n"); strings.HasPrefix(first, "# imagepin: imagepind made") {
		kept = rest
	}
	put(t, made, kept, 0o644)
	if err := m.SyncHosts(nil); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(made); !strings.Contains(string(b), "three.example") || strings.Contains(string(b), blockBegin) {
		t.Fatalf("the kept file:\n%s", b)
	}
}

// A registry directory (or _default) of certificate files only: containerd reads them
// only while there is no hosts.toml, so the file imagepind makes names them as
// containerd used them (for its default server), and the server's TLS is as before.
func TestMirrorHostsCarryCertificateFiles(t *testing.T) {
	m, conf := newMirror(t)
	for _, d := range []string{"quay.io", "_default"} {
		for _, f := range []string{"ca.crt", "client.cert", "client.key", "bundle.cert", "stray.key"} {
			put(t, filepath.Join(conf, d, f), "x", 0o644)
		}
	}
	before := map[string][]endpoint{}
	for _, d := range []string{"quay.io", "_default"} {
		eps, _, err := readHostDir(filepath.Join(conf, d))
		if err != nil {
			t.Fatal(err)
		}
		before[d] = eps
	}
	if err := m.SyncHosts([]string{"quay.io", "ghcr.io"}); err != nil {
		t.Fatal(err)
	}
	for reg, d := range map[string]string{"quay.io": "quay.io", "ghcr.io": "_default"} {
		eps, _, err := readHostDir(filepath.Join(conf, reg))
		if err != nil {
			t.Fatal(err)
		}
		server := eps[len(eps)-1]
		want := before[d][0]
		if len(eps) != 2 || eps[0].host != "127.0.0.1:7443" || server.host != "" ||
			!slices.Equal(server.ca, want.ca) || !slices.Equal(server.client, want.client) || len(want.ca) != 1 || len(want.client) != 2 {
			t.Fatalf("%s: endpoints %+v, want the server with %+v", reg, eps, want)
		}
	}
	if err := m.SyncHosts(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(conf, "quay.io", "hosts.toml")); !os.IsNotExist(err) {
		t.Fatalf("the made hosts.toml is still there: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(conf, "quay.io")); len(entries) != 5 {
		t.Fatalf("the certificate files: %v", entries)
	}
	if _, err := os.Stat(filepath.Join(conf, "ghcr.io")); !os.IsNotExist(err) {
		t.Fatalf("ghcr.io's made directory is still there: %v", err)
	}
}

// A copy of _default/hosts.toml in <registry>/ means what _default's means: its relative
// ca and client paths made absolute (before, they named files missing from <registry>/,
// and containerd refused to configure the registry), the hosts in their order, headers
// kept.
func TestMirrorHostsDefaultCopyKeepsItsPaths(t *testing.T) {
	m, conf := newMirror(t)
	def := `server = "https://upstream.example"
ca = "ca.crt"

[host."https://b.example"]
  capabilities = ["pull", "resolve"]
  client = [["certs/c.cert", "certs/c.key"], "/etc/abs.pem"]
  [host."https://b.example".header]
    Authorization = "Basic eA=="

[host."https://a.example:5000"]
  capabilities = ["pull"]
  ca = ["a.crt", "/etc/ssl/abs.crt"]
  skip_verify = false
  override_path = true
`
	put(t, filepath.Join(conf, "_default", "hosts.toml"), def, 0o600)
	want, _, err := readHostDir(filepath.Join(conf, "_default"))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SyncHosts([]string{"quay.io"}); err != nil {
		t.Fatal(err)
	}
	got, _, err := readHostDir(filepath.Join(conf, "quay.io"))
	if err != nil {
		b, _ := os.ReadFile(filepath.Join(conf, "quay.io", "hosts.toml"))
		t.Fatalf("%v:\n%s", err, b)
	}
	if len(got) != len(want)+1 || !reflect.DeepEqual(got[1:], want) {
		b, _ := os.ReadFile(filepath.Join(conf, "quay.io", "hosts.toml"))
		t.Fatalf("the copy:\n%s\nreads %+v\nwant %+v", b, got[1:], want)
	}
	if b, _ := os.ReadFile(filepath.Join(conf, "quay.io", "hosts.toml")); !strings.Contains(string(b), "Basic eA==") {
		t.Fatalf("the header is lost:\n%s", b)
	}
	// Without relative paths, the copy is _default's text as it is.
	abs := strings.ReplaceAll(strings.ReplaceAll(def, `"ca.crt"`, `"/etc/ca.crt"`), `"a.crt"`, `"/etc/a.crt"`)
	abs = strings.ReplaceAll(abs, `[["certs/c.cert", "certs/c.key"], `, `[`)
	put(t, filepath.Join(conf, "_default", "hosts.toml"), abs, 0o600)
	if err := m.SyncHosts([]string{"quay.io"}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(conf, "quay.io", "hosts.toml"))
	if !strings.Contains(string(stripBlock(b)), abs) {
		t.Fatalf("the copy is not _default's text:\n%s", b)
	}
}

// Render takes the registries of the pinned references (not wildcard patterns), asks for
// no reload, and names the hosts.toml files in its error.
func TestMirrorHostsRenderThePinnedRegistries(t *testing.T) {
	m, conf := newMirror(t)
	ref := "quay.io/ns/app@sha256:" + strings.Repeat("1", 64)
	if changed, err := m.Render([]string{ref, "ghcr.io/ns/*"}); err != nil || changed {
		t.Fatalf("render: %v %v", changed, err)
	}
	if b, err := os.ReadFile(filepath.Join(conf, "quay.io", "hosts.toml")); err != nil || !strings.Contains(string(b), blockBegin) {
		t.Fatalf("quay.io's hosts.toml %v:\n%s", err, b)
	}
	if _, err := os.Stat(filepath.Join(conf, "ghcr.io")); !os.IsNotExist(err) {
		t.Fatalf("a wildcard pattern's registry was given a block: %v", err)
	}
	put(t, filepath.Join(conf, "quay.io", "hosts.toml"), "[broken", 0o644)
	if _, err := m.Render([]string{ref}); err == nil || !strings.HasPrefix(err.Error(), "node-local mirror's hosts.toml: ") {
		t.Fatalf("a broken file: %v", err)
	}
	if changed, err := m.Render(nil); err != nil || changed {
		t.Fatalf("render of no pins: %v %v", changed, err)
	}
}
