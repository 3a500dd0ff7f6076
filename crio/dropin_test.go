package crio

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

func setup(t *testing.T) DropIn {
	t.Helper()
	root := t.TempDir()
	d := DropIn{MainConfig: filepath.Join(root, "crio.conf"), ConfigDir: filepath.Join(root, "crio.conf.d")}
	if err := os.MkdirAll(d.ConfigDir, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestRenderSortedDedupedParses(t *testing.T) {
	b, err := Render([]string{"quay.io/b@sha256:2", "quay.io/a@sha256:1", "quay.io/b@sha256:2", "registry.example/x*"})
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Crio struct {
			Image struct {
				PinnedImages []string `toml:"pinned_images"`
			} `toml:"image"`
		} `toml:"crio"`
	}
	if _, err := toml.Decode(string(b), &doc); err != nil {
		t.Fatal(err)
	}
	want := []string{"quay.io/a@sha256:1", "quay.io/b@sha256:2", "registry.example/x*"}
	if !slices.Equal(doc.Crio.Image.PinnedImages, want) {
		t.Fatalf("got %q", doc.Crio.Image.PinnedImages)
	}
	if !strings.Contains(string(b), "[crio.image]") {
		t.Fatalf("table: %s", b)
	}
}

func TestRenderRefusesWhatCrashesCRIO(t *testing.T) {
	for _, p := range []string{"*", "**", "", "a\nb", "x\"]\n[crio.runtime]\n"} {
		if _, err := Render([]string{"quay.io/a@sha256:1", p}); err == nil {
			t.Errorf("Render accepted %q", p)
		}
	}
	// Quotes alone are not dangerous once encoded; make sure they round-trip.
	b, err := Render([]string{`we"ird`})
	if err != nil || !strings.Contains(string(b), `we\"ird`) {
		t.Fatalf("%s %v", b, err)
	}
}

func TestApplyWritesOnlyOnChangeAndRemovesWhenEmpty(t *testing.T) {
	d := setup(t)
	changed, err := d.Apply([]string{"quay.io/a@sha256:1"})
	if err != nil || !changed {
		t.Fatalf("first write: %v %v", changed, err)
	}
	fi1, _ := os.Stat(d.Path())
	changed, err = d.Apply([]string{"quay.io/a@sha256:1"})
	if err != nil || changed {
		t.Fatalf("same content must not be rewritten: %v %v", changed, err)
	}
	fi2, _ := os.Stat(d.Path())
	if !os.SameFile(fi1, fi2) {
		t.Fatal("file was replaced although its content did not change")
	}
	// The temp file never lands in the drop-in directory, nor stays in its parent.
	ents, _ := os.ReadDir(d.ConfigDir)
	if len(ents) != 1 {
		t.Fatalf("drop-in dir holds %d entries", len(ents))
	}
	ents, _ = os.ReadDir(filepath.Dir(d.ConfigDir))
	for _, e := range ents {
		if strings.Contains(e.Name(), "tmp") {
			t.Fatalf("temp file left: %s", e.Name())
		}
	}
	changed, err = d.Apply(nil)
	if err != nil || !changed {
		t.Fatalf("remove: %v %v", changed, err)
	}
	if _, err := os.Stat(d.Path()); !os.IsNotExist(err) {
		t.Fatal("empty drop-in must be removed")
	}
	if changed, _ := d.Apply(nil); changed {
		t.Fatal("removing an absent drop-in is no change")
	}
}

func TestExistingAndEffectiveFollowCRIOOrder(t *testing.T) {
	d := setup(t)
	write(t, d.MainConfig, "[crio.image]\npinned_images = [\"main/a\"]\n")
	write(t, filepath.Join(d.ConfigDir, "10-admin.conf"), "[crio.image]\npinned_images = [\"admin/b\", \"*\", \"main/a\"]\n")
	write(t, filepath.Join(d.ConfigDir, "20-other.conf"), "[crio.runtime]\nlog_level = \"info\"\n")
	write(t, filepath.Join(d.ConfigDir, "sub", "x.conf"), "[crio.image]\npinned_images = [\"sub/c\"]\n")
	write(t, filepath.Join(d.ConfigDir, ".hidden"), "[crio.image]\npinned_images = [\"hidden/d\"]\n")
	if _, err := d.Apply([]string{"ours/e"}); err != nil {
		t.Fatal(err)
	}
	files := d.Scan()
	ex := d.Existing(files)
	if want := []string{"main/a", "hidden/d", "admin/b", "sub/c"}; !slices.Equal(ex.Inherited, want) {
		t.Fatalf("inherited %q, want %q", ex.Inherited, want)
	}
	if len(ex.Skipped) != 1 || !strings.Contains(ex.Skipped[0], "would crash CRI-O") {
		t.Fatalf("skipped %q", ex.Skipped)
	}
	if len(ex.Overriders) != 0 {
		t.Fatalf("overriders %q", ex.Overriders)
	}
	if eff := d.Effective(files, []string{"ours/e"}); !slices.Equal(eff, []string{"ours/e"}) {
		t.Fatalf("effective %q", eff)
	}
	// Without our drop-in the last file that sets the list wins (sub/x.conf).
	if eff := d.Effective(files, nil); !slices.Equal(eff, []string{"sub/c"}) {
		t.Fatalf("effective without ours %q", eff)
	}

	// A file after ours overrides it.
	write(t, filepath.Join(d.ConfigDir, "zzz-late.conf"), "[crio.image]\npinned_images = [\"late/f\"]\n")
	files = d.Scan()
	ex = d.Existing(files)
	if len(ex.Overriders) != 1 || !strings.HasSuffix(ex.Overriders[0], "zzz-late.conf") {
		t.Fatalf("overriders %q", ex.Overriders)
	}
	if eff := d.Effective(files, []string{"ours/e"}); !slices.Equal(eff, []string{"late/f"}) {
		t.Fatalf("effective %q", eff)
	}

	// A broken file is reported, not fatal.
	write(t, filepath.Join(d.ConfigDir, "30-broken.conf"), "[crio.image\n")
	ex = d.Existing(d.Scan())
	if len(ex.Errors) != 1 || !strings.Contains(ex.Errors[0].Error(), "30-broken.conf") {
		t.Fatalf("errors %v", ex.Errors)
	}
}

func TestSupportOf(t *testing.T) {
	cases := map[string]Support{
		"1.27.9":         {},
		"1.28.0":         {PinnedImages: true},
		"1.29.3":         {PinnedImages: true},
		"1.29.4":         {PinnedImages: true, PinOnReload: true},
		"1.29.7":         {PinnedImages: true, PinOnReload: true, UnpinOnReload: true},
		"1.30.0":         {PinnedImages: true, PinOnReload: true},
		"1.30.3":         {PinnedImages: true, PinOnReload: true, UnpinOnReload: true},
		"1.31.0":         {true, true, true, true, false, false},
		"1.34.0":         {true, true, true, true, false, false},
		"v1.34.1-dev+ab": {true, true, true, true, false, false},
		"1.34.11":        {true, true, true, true, false, false},
		"1.35.0":         {true, true, true, true, false, true},
		"1.35.1":         {true, true, true, true, false, true},
		"1.35.2":         {true, true, true, true, true, true},
		"1.36.0":         {true, true, true, true, true, true},
		"v1.36.3":        {true, true, true, true, true, true},
		"2.0.0":          {true, true, true, true, true, true},
	}
	for v, want := range cases {
		got, err := SupportOf(v)
		if err != nil || got != want {
			t.Errorf("SupportOf(%q) = %+v, %v; want %+v", v, got, err, want)
		}
	}
	if _, err := SupportOf("banana"); err == nil {
		t.Error("unparsable version must be reported")
	}
	s, _ := SupportOf("1.29.1")
	if msg := s.TooOld("1.29.1"); !strings.Contains(msg, "restart CRI-O") {
		t.Errorf("TooOld = %q", msg)
	}
	s, _ = SupportOf("1.34.0")
	if msg := s.TooOld("1.34.0"); msg != "" {
		t.Errorf("TooOld = %q", msg)
	}
}
