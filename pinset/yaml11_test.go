package pinset

import (
	"strings"
	"testing"
)

// Values YAML 1.1 reads as booleans or numbers where text belongs get an error that says
// so and how to fix it, naming the file, the document and the field (it used to be Go's
// "json: cannot unmarshal bool into Go struct field metadata.metadata.name").
func TestYAML11ValuesAreExplained(t *testing.T) {
	img := "quay.io/a/b@" + d1
	for _, c := range []struct {
		doc, field, kind string
	}{
		{"metadata: {name: y}\nspec: {pinnedImages: [" + img + "]}", "metadata.name", "boolean"},
		{"metadata: {name: no}\nspec: {pinnedImages: [" + img + "]}", "metadata.name", "boolean"},
		{"metadata: {name: 0755}\nspec: {pinnedImages: [" + img + "]}", "metadata.name", "number"},
		{"metadata: {name: s, uid: 12}\nspec: {pinnedImages: [" + img + "]}", "metadata.uid", "number"},
		{"metadata: {name: s}\nspec: {releaseImage: " + img + ", osImageStream: off, pinnedImages: [" + img + "]}", "spec.osImageStream", "boolean"},
		{"metadata: {name: s}\nspec: {nodeSelector: {matchLabels: {a: yes}}, pinnedImages: [" + img + "]}", "spec.nodeSelector.matchLabels", "boolean"},
	} {
		text := "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\n" + c.doc + "\n"
		_, err := ParseSetFile("sets/a.yaml", []byte("---\n"+text))
		if err == nil {
			t.Errorf("%q parsed", c.doc)
			continue
		}
		msg := err.Error()
		for _, want := range []string{"sets/a.yaml: ", "document 1", c.field + ": ", c.kind, "quotes"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%q: %q lacks %q", c.doc, msg, want)
			}
		}
		if strings.Contains(msg, "Go struct field") {
			t.Errorf("%q: Go's own wording leaks: %s", c.doc, msg)
		}
	}
	// Quoted, the same values are fine.
	if _, err := ParseSetFile("a.yaml", []byte("apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: \"y\"}\nspec: {pinnedImages: ["+img+"]}\n")); err != nil {
		t.Fatal(err)
	}
}
