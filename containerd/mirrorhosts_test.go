package containerd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	m := &MirrorPinner{Local: "127.0.0.1:7443", ConfigPath: conf, Record: filepath.Join(dir, "record.json"), Path: pathFor}
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
	m := &MirrorPinner{Local: "127.0.0.1:7443", ConfigPath: conf, Record: filepath.Join(dir, "record.json"), Path: pathFor}
	err := m.SyncHosts([]string{"quay.io"})
	if err == nil || !strings.Contains(err.Error(), "does not parse") {
		t.Fatalf("error %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(conf, "quay.io", "hosts.toml")); string(got) != broken {
		t.Fatalf("the broken file was changed:\n%s", got)
	}
}
