package original

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// The record is written once: a later Keep (a later run, after imagepind changed the
// file) never replaces what the path held before the first change.
func TestKeepRecordsOnce(t *testing.T) {
	root := t.TempDir()
	b := New(filepath.Join(root, "state"))
	p := filepath.Join(root, "etc", "hosts.toml")
	os.MkdirAll(filepath.Dir(p), 0o755)
	os.WriteFile(p, []byte("admin"), 0o640)
	if err := b.Keep(p); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(p, []byte("admin + imagepind"), 0o640)
	if err := b.Keep(p); err != nil {
		t.Fatal(err)
	}
	rs, err := b.Records()
	if err != nil || len(rs) != 1 {
		t.Fatalf("records %v, %v: want one", rs, err)
	}
	if r := rs[0]; !r.Exists || string(r.Data) != "admin" || r.Mode != 0o640 || r.UID != os.Getuid() {
		t.Fatalf("record %+v: want the first content, 0640, owner %d", r, os.Getuid())
	}
}

// An administrator's file comes back with its bytes and mode; a file imagepind made goes,
// with the directories it made, when empty, and not the ones that were there.
func TestRestore(t *testing.T) {
	root := t.TempDir()
	b := New(filepath.Join(root, "state"))
	admin := filepath.Join(root, "etc", "admin.toml")
	os.MkdirAll(filepath.Dir(admin), 0o755)
	os.WriteFile(admin, []byte("server = \"x\""), 0o600)
	made := filepath.Join(root, "etc", "new", "deeper", "ca.crt")
	for _, p := range []string{admin, made} {
		if err := b.Keep(p); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(admin, []byte("server = \"x\"\n[host]\n"), 0o644)
	os.MkdirAll(filepath.Dir(made), 0o755)
	os.WriteFile(made, []byte("ours"), 0o644)

	rs, _ := b.Records()
	outs := map[string]Outcome{}
	for _, r := range rs {
		out, err := Restore(r, Current{})
		if err != nil {
			t.Fatal(err)
		}
		outs[r.Path] = out
	}
	if got, _ := os.ReadFile(admin); !bytes.Equal(got, []byte("server = \"x\"")) {
		t.Errorf("admin file %q, want its original bytes", got)
	}
	if fi, _ := os.Stat(admin); fi.Mode().Perm() != 0o600 {
		t.Errorf("admin file mode %v, want 0600", fi.Mode())
	}
	if _, err := os.Stat(filepath.Join(root, "etc", "new")); !os.IsNotExist(err) {
		t.Errorf("the directories imagepind made are still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc")); err != nil {
		t.Errorf("a directory that was there is gone: %v", err)
	}
	if outs[admin] != Restored || outs[made] != Removed {
		t.Errorf("outcomes %v", outs)
	}
	// Again: nothing to do.
	for _, r := range rs {
		if out, err := Restore(r, Current{}); err != nil || (r.Path == admin && out != Unchanged) {
			t.Errorf("second restore of %s: %v, %v", r.Path, out, err)
		}
	}
}

// A path that is not a regular file is not recorded, and the caller leaves it.
func TestKeepRefusesNonRegular(t *testing.T) {
	root := t.TempDir()
	b := New(filepath.Join(root, "state"))
	link := filepath.Join(root, "hosts.toml")
	os.Symlink("/etc/shared.toml", link)
	if err := b.Keep(link); err == nil {
		t.Fatal("Keep of a symbolic link: no error")
	}
}
