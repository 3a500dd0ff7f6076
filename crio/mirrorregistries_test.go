package crio

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The mirror drop-in follows the pins; a broken administrator's registries.conf is an
// error (the pinner makes it a fault) that writes no mirror drop-in; nothing is
// rewritten when nothing changed, and a drop-in removed behind imagepind's back comes
// back.
func TestMirrorRegistriesFollowsThePinsAndSurvivesABadRegistriesConf(t *testing.T) {
	dir := t.TempDir()
	regConf := filepath.Join(dir, "registries.conf")
	regDir := filepath.Join(dir, "registries.conf.d")
	os.MkdirAll(regDir, 0o755)
	os.WriteFile(regConf, []byte("[[registry]\nbroken"), 0o644)
	m := &MirrorRegistries{
		Local: "127.0.0.1:7443", Admin: &AdminFiles{Main: regConf, Dir: regDir, Scratch: filepath.Join(dir, "scratch")},
		Path: func(r string) string { return r },
	}
	ref := "quay.io/ns/app@sha256:" + strings.Repeat("1", 64)
	dropIn := filepath.Join(regDir, MirrorDropInName)

	changed, err := m.Render([]string{ref})
	if err == nil || changed || !strings.Contains(err.Error(), "registries.conf") || !strings.HasPrefix(err.Error(), "node-local mirror's registries drop-in: ") {
		t.Fatalf("broken registries.conf: %v %v", changed, err)
	}
	if _, err := os.Stat(dropIn); !os.IsNotExist(err) {
		t.Fatalf("a mirror drop-in was written over a broken registries.conf: %v", err)
	}

	os.WriteFile(regConf, []byte("unqualified-search-registries = []\n"), 0o644)
	if changed, err := m.Render([]string{ref}); err != nil || !changed {
		t.Fatalf("fixed registries.conf: %v %v", changed, err)
	}
	data, err := os.ReadFile(dropIn)
	if err != nil || !strings.Contains(string(data), `location = "127.0.0.1:7443/quay.io/ns/app"`) {
		t.Fatalf("drop-in %v:\n%s", err, data)
	}
	if changed, _ := m.Render([]string{ref}); changed {
		t.Fatal("an unchanged render changed something")
	}
	os.Remove(dropIn)
	if changed, _ := m.Render([]string{ref}); !changed {
		t.Fatal("a removed drop-in was not written again")
	}
	if changed, _ := m.Render(nil); !changed {
		t.Fatal("no pins left, yet the drop-in stays")
	}
	if _, err := os.Stat(dropIn); !os.IsNotExist(err) {
		t.Fatalf("drop-in with no pins: %v", err)
	}
}
