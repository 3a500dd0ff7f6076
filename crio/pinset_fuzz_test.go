package crio

import (
	"testing"

	"github.com/imagepin/imagepin/pinset"
)

// FuzzRenderParsedSets: every image of the sets package pinset accepts from a file
// renders into the drop-in (Render refuses nothing pinset lets through).
func FuzzRenderParsedSets(f *testing.F) {
	const (
		d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
		d2 = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	)
	f.Add([]byte("apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: a}\nspec:\n  nodeSelector: {matchLabels: {a: b}}\n  pinnedImages: [\"quay.io/x/a@" + d1 + "\"]\n"))
	f.Add([]byte("apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nmetadata: {name: b, labels: {machineconfiguration.openshift.io/role: worker}}\nspec: {pinnedImages: [{name: \"quay.io/x/b@" + d2 + "\"}]}\n"))
	f.Add([]byte(`{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"machineconfiguration.openshift.io/v1alpha1","kind":"PinnedImageSet","metadata":{"name":"c"},"spec":{"pinnedImages":["localhost:5000/x/c:v1@` + d1 + `"]}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := pinset.ParseSetFile("f.yaml", data)
		if err != nil {
			return
		}
		var all []string
		for _, s := range res.Sets {
			all = append(all, s.Images...)
		}
		if _, err := Render(all); err != nil {
			t.Fatalf("images pinset accepted do not render: %v\n%q", err, all)
		}
	})
}
