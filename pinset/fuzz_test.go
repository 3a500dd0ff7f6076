package pinset

import (
	"strings"
	"testing"
	"time"
)

// FuzzParseSetFile: any input either fails with an error naming the file, or yields sets
// whose images are valid digest references (that they render into a drop-in CRI-O can
// read is crio's FuzzRenderParsedSets: the model's tests import no runtime).
func FuzzParseSetFile(f *testing.F) {
	f.Add([]byte("apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: a}\nspec:\n  nodeSelector: {matchLabels: {a: b}}\n  pinnedImages: [\"quay.io/x/a@" + d1 + "\"]\n"))
	f.Add([]byte("apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nmetadata: {name: b, labels: {machineconfiguration.openshift.io/role: worker}}\nspec: {pinnedImages: [{name: \"quay.io/x/b@" + d2 + "\"}]}\n"))
	f.Add([]byte(`{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"machineconfiguration.openshift.io/v1alpha1","kind":"PinnedImageSet","metadata":{"name":"c"},"spec":{"pinnedImages":["quay.io/x/c@` + d1 + `"]}}]}`))
	f.Add([]byte("a: &a [x]\nb: [*a, *a]\n---\n- *b\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		// Never a hang: a parse that takes seconds is a failure, with the input saved.
		var res ParseResult
		var err error
		done := make(chan struct{})
		go func() { res, err = ParseSetFile("f.yaml", data); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			t.Fatalf("parse of %d bytes took over 2 s: %q", len(data), data[:min(len(data), 200)])
		}
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.yaml: ") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		for _, s := range res.Sets {
			if s.Name == "" || s.UID == "" || s.SpecHash == "" || len(s.Images) == 0 {
				t.Fatalf("incomplete set %+v", s)
			}
			for _, img := range s.Images {
				if err := ValidateImage(img); err != nil {
					t.Fatalf("accepted invalid image %q: %v", img, err)
				}
			}
		}
	})
}
