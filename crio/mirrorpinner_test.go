package crio

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The mirror drop-in follows the pins; a broken administrator's registries.conf is a
// fault that writes no mirror drop-in and never stops the pins; nothing is rewritten
// when nothing changed, and a drop-in removed behind imagepind's back comes back.
func TestMirrorPinnerWritesFollowsAndSurvivesABadRegistriesConf(t *testing.T) {
	dir := t.TempDir()
	regConf := filepath.Join(dir, "registries.conf")
	regDir := filepath.Join(dir, "registries.conf.d")
	os.MkdirAll(regDir, 0o755)
	os.MkdirAll(filepath.Join(dir, "crio.conf.d"), 0o755)
	os.WriteFile(regConf, []byte("[[registry]\nbroken"), 0o644)
	m := &MirrorPinner{
		Pinner: &Pinner{DropIn: DropIn{MainConfig: filepath.Join(dir, "crio.conf"), ConfigDir: filepath.Join(dir, "crio.conf.d"), Cache: NewFileCache()}},
		Local:  "127.0.0.1:7443", Admin: &AdminFiles{Main: regConf, Dir: regDir, Scratch: filepath.Join(dir, "scratch")},
		Path: func(r string) string { return r },
	}
	var told []string
	m.OnPins = func(refs []string) { told = refs }
	ref := "quay.io/ns/app@sha256:" + strings.Repeat("1", 64)
	ctx := context.Background()
	dropIn := filepath.Join(regDir, MirrorDropInName)

	w, err := m.Write(ctx, []string{ref}, nil)
	if err != nil || !w.Changed || len(w.Faults) != 1 || !strings.Contains(w.Faults[0], "registries.conf") {
		t.Fatalf("broken registries.conf: %+v %v", w, err)
	}
	if _, err := os.Stat(dropIn); !os.IsNotExist(err) {
		t.Fatalf("a mirror drop-in was written over a broken registries.conf: %v", err)
	}
	if len(told) != 1 || told[0] != ref {
		t.Fatalf("the mirror was told %v", told)
	}

	os.WriteFile(regConf, []byte("unqualified-search-registries = []\n"), 0o644)
	if w, err := m.Write(ctx, []string{ref}, nil); err != nil || !w.Changed || len(w.Faults) != 0 {
		t.Fatalf("fixed registries.conf: %+v %v", w, err)
	}
	data, err := os.ReadFile(dropIn)
	if err != nil || !strings.Contains(string(data), `location = "127.0.0.1:7443/quay.io/ns/app"`) {
		t.Fatalf("drop-in %v:\n%s", err, data)
	}
	if w, _ := m.Write(ctx, []string{ref}, nil); w.Changed {
		t.Fatal("an unchanged write changed something")
	}
	os.Remove(dropIn)
	if w, _ := m.Write(ctx, []string{ref}, nil); !w.Changed {
		t.Fatal("a removed drop-in was not written again")
	}
	if w, _ := m.Write(ctx, nil, nil); !w.Changed {
		t.Fatal("no pins left, yet the drop-in stays")
	}
	if _, err := os.Stat(dropIn); !os.IsNotExist(err) {
		t.Fatalf("drop-in with no pins: %v", err)
	}
}
