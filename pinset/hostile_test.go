package pinset

import (
	"strings"
	"testing"
	"time"
)

// Hostile documents fail fast with an error naming the file; none panics or hangs.
func TestHostileDocuments(t *testing.T) {
	var bomb strings.Builder
	bomb.WriteString("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n")
	prev := "a"
	for _, n := range []string{"b", "c", "d", "e", "f", "g", "h", "i"} {
		bomb.WriteString(n + ": &" + n + " [")
		for i := 0; i < 9; i++ {
			if i > 0 {
				bomb.WriteString(",")
			}
			bomb.WriteString("*" + prev)
		}
		bomb.WriteString("]\n")
		prev = n
	}
	deepJSON := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	deepYAML := strings.Repeat("- ", 20000) + "x\n"
	big := "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\n# " + strings.Repeat("x", MaxSetFileSize) + "\n"
	many := strings.Repeat("---\napiVersion: v1\nkind: PinnedImageSet\n", MaxDocumentsPerFile+1)
	cases := map[string]string{
		"alias bomb":       bomb.String(),
		"deep JSON":        deepJSON,
		"deep YAML":        deepYAML,
		"too large":        big,
		"many documents":   many,
		"binary":           "\x00\x01\x02\xff\xfe",
		"tab indentation":  "apiVersion: x\n\tkind: y\n",
		"scalar document":  "just a string",
		"list at the top":  "- a\n- b\n",
		"null spec":        "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: a}\nspec: null\n",
		"huge name":        "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: " + strings.Repeat("a", 300) + "}\nspec: {pinnedImages: [\"quay.io/x/a@" + d1 + "\"]}\n",
		"image with \\n":   "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: a}\nspec: {pinnedImages: [\"quay.io/x/a@" + d1 + "\\n[crio.runtime]\"]}\n",
		"image with quote": "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: a}\nspec: {pinnedImages: ['quay.io/x/a@" + d1 + "\"]']}\n",
		"glob image":       "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: a}\nspec: {pinnedImages: [\"quay.io/*\"]}\n",
	}
	for name, text := range cases {
		start := time.Now()
		_, err := ParseSetFile("hostile.yaml", []byte(text))
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if !strings.HasPrefix(err.Error(), "hostile.yaml: ") {
			t.Errorf("%s: error does not name the file: %v", name, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%s: took %s", name, d)
		}
		if len(err.Error()) > 8<<10 {
			t.Errorf("%s: a %d-byte error would flood the status", name, len(err.Error()))
		}
	}
}
