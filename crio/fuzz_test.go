package crio

import (
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// FuzzRender: whatever patterns come in, the drop-in either is refused or parses as TOML
// to exactly the sorted, deduplicated patterns, sets nothing else, and holds no pattern
// that would crash CRI-O.
func FuzzRender(f *testing.F) {
	f.Add("quay.io/a@sha256:1", "registry.example/x*", "*kw*")
	f.Add("*", "", "a\"]\n[crio.runtime]\nb = \"")
	f.Add("\\", "\u2028", "'''")
	f.Fuzz(func(t *testing.T, a, b, c string) {
		in := []string{a, b, c}
		out, err := Render(in)
		if err != nil {
			return
		}
		var doc map[string]any
		md, err := toml.Decode(string(out), &doc)
		if err != nil {
			t.Fatalf("rendered drop-in does not parse: %v\n%s", err, out)
		}
		keys := md.Keys()
		for _, k := range keys {
			if s := k.String(); s != "crio" && s != "crio.image" && s != "crio.image.pinned_images" {
				t.Fatalf("drop-in sets %s", s)
			}
		}
		var got struct {
			Crio struct {
				Image struct {
					PinnedImages []string `toml:"pinned_images"`
				} `toml:"image"`
			} `toml:"crio"`
		}
		toml.Decode(string(out), &got)
		want := slices.Clone(in)
		sort.Strings(want)
		want = slices.Compact(want)
		if !slices.Equal(got.Crio.Image.PinnedImages, want) {
			t.Fatalf("read back %q, want %q", got.Crio.Image.PinnedImages, want)
		}
		for _, p := range got.Crio.Image.PinnedImages {
			if strings.Trim(p, "*") == "" {
				t.Fatalf("pattern %q would crash CRI-O", p)
			}
		}
	})
}
