package resolve

import (
	"strings"
	"testing"

	"github.com/imagepin/imagepin/pinset"
)

const d64 = "sha256:0000000000000000000000000000000000000000000000000000000000000000"

func TestParseFindsEveryReference(t *testing.T) {
	f, err := Parse("l.yaml", []byte(`apiVersion: v1
kind: List
items:
- apiVersion: machineconfiguration.openshift.io/v1
  kind: PinnedImageSet
  metadata: {name: a, labels: {machineconfiguration.openshift.io/role: worker}}
  spec:
    pinnedImages: [{name: "quay.io/x/a:1"}]
- apiVersion: imagepin.io/v1alpha1
  kind: PinnedImageSet
  metadata: {name: b}
  spec:
    nodeSelector: {}
    releaseImage: quay.io/ocp/release:4.20.1
    pinnedImages: ["quay.io/x/b:2"]
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range f.Refs {
		got = append(got, r.Set+" "+r.Field+" "+r.Image)
	}
	want := "a spec.pinnedImages[0].name quay.io/x/a:1|b spec.pinnedImages[0] quay.io/x/b:2|b spec.releaseImage quay.io/ocp/release:4.20.1"
	if strings.Join(got, "|") != want {
		t.Fatalf("refs\n%s\nwant\n%s", strings.Join(got, "|"), want)
	}
	f.Rewrite(func(img string) string { return strings.Split(img, ":")[0] + "@" + d64 })
	out, err := f.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	res, err := pinset.ParseSetFile("out.yaml", out)
	if err != nil || len(res.Sets) != 2 || res.Sets[1].ReleaseImage != "quay.io/ocp/release@"+d64 {
		t.Fatalf("%v %+v\n%s", err, res, out)
	}
}

func TestParseRefusesWhatIsNotASetOrAList(t *testing.T) {
	for in, want := range map[string]string{
		"":                  "the file is empty",
		"kind: ConfigMap\n": `kind: "ConfigMap", want PinnedImageSet`,
		"kind: PinnedImageSet\nmetadata: {name: a}\n":                               `set "a": spec: missing`,
		"kind: PinnedImageSet\nmetadata: {name: a}\nspec: {pinnedImages: {a: b}}\n": "spec.pinnedImages: want a sequence, got a mapping",
		"kind: PinnedImageSet\nmetadata: {name: a}\nspec: {pinnedImages: [[x]]}\n":  "spec.pinnedImages[0]: want an image reference",
		"kind: List\nitems: {}\n": "a List needs a sequence of items",
		"- a\n- {b: c}\n":         "item 2 of the image list: want an image reference, got a mapping",
		"a\n---\nb\n":             "a list of images must be a single document",
		"x: [\n":                  "document 1:",
		"a: &x [*x]\n":            "",
	} {
		_, err := Parse("f", []byte(in))
		if want == "" {
			continue // must only not hang or panic
		}
		if err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "f: ") {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}

func TestImageListForms(t *testing.T) {
	for _, in := range []string{"# comment\nquay.io/a:1\n\nquay.io/b:2 # trailing\n", "- quay.io/a:1\n- quay.io/b:2\n"} {
		f, err := Parse("l", []byte(in))
		if err != nil || !f.ImageList || len(f.Refs) != 2 || f.Refs[0].Image != "quay.io/a:1" || f.Refs[1].Image != "quay.io/b:2" {
			t.Fatalf("%q: %v %+v", in, err, f)
		}
	}
}

// Parse never panics, and what it rewrites stays parseable.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"kind: PinnedImageSet\nmetadata: {name: a}\nspec: {pinnedImages: [quay.io/a:1]}\n", "- a\n- b\n",
		`{"kind": "List", "items": [{"kind": "PinnedImageSet", "spec": {"pinnedImages": [{"name": "x"}]}}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse("f", data)
		if err != nil || p.ImageList {
			return
		}
		p.Rewrite(func(img string) string { return "quay.io/x/y@" + d64 })
		out, err := p.Bytes()
		if err != nil {
			return
		}
		if _, err := Parse("again", out); err != nil {
			t.Fatalf("rewritten file does not parse: %v\n%s", err, out)
		}
	})
}
