package pinset

import (
	"slices"
	"strings"
	"testing"
)

func TestTaggedImagesPinTheirDigest(t *testing.T) {
	doc := "apiVersion: imagepin.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: s}\nspec:\n  nodeSelector: {}\n  pinnedImages:\n" +
		"  - name: quay.io/x/a:v1@" + d1 + "\n" +
		"  - name: quay.io/x/a:stable@" + d1 + "\n" +
		"  - name: quay.io/x/a@" + d1 + "\n" +
		"  - name: quay.io/x/b@" + d2 + "\n"
	res, err := ParseSetFile("s.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	s := res.Sets[0]
	if want := []string{"quay.io/x/a@" + d1, "quay.io/x/b@" + d2}; !slices.Equal(s.Images, want) {
		t.Fatalf("images %v, want %v (the digest once, without its tags)", s.Images, want)
	}
	want := []Tag{{Name: "quay.io/x/a:v1", Image: "quay.io/x/a@" + d1}, {Name: "quay.io/x/a:stable", Image: "quay.io/x/a@" + d1}}
	if !slices.Equal(s.Tags, want) {
		t.Fatalf("tags %+v, want %+v", s.Tags, want)
	}
	if tg := s.Tags[0]; tg.Repo() != "quay.io/x/a" || tg.TagOnly() != "v1" || tg.Digest() != d1 {
		t.Fatalf("parts of %+v: %q %q %q", tg, tg.Repo(), tg.TagOnly(), tg.Digest())
	}

	// A tag changes the set's spec hash; a set without tags keeps the hash it had.
	untagged := "apiVersion: imagepin.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: s}\nspec:\n  nodeSelector: {}\n  pinnedImages: [\"quay.io/x/a@" + d1 + "\", \"quay.io/x/b@" + d2 + "\"]\n"
	res2, err := ParseSetFile("s.yaml", []byte(untagged))
	if err != nil {
		t.Fatal(err)
	}
	if res2.Sets[0].SpecHash == s.SpecHash {
		t.Fatal("adding tags left the spec hash as it was")
	}
	if got := specHash(res2.Sets[0].Selector.String(), res2.Sets[0].Images, nil, "", ""); got != res2.Sets[0].SpecHash {
		t.Fatal("the hash of a set without tags changed")
	}
}

func TestTagsOfLeavesOutConflicts(t *testing.T) {
	a := Set{Name: "a", Tags: []Tag{{Name: "r/x:v1", Image: "r/x@" + d1}, {Name: "r/x:v2", Image: "r/x@" + d1}}}
	b := Set{Name: "b", Tags: []Tag{{Name: "r/x:v1", Image: "r/x@" + d1}, {Name: "r/x:v2", Image: "r/x@" + d2}}}
	tags, conflicts := TagsOf([]Set{a, b})
	if len(tags) != 1 || tags[0].Name != "r/x:v1" {
		t.Fatalf("tags %+v, want r/x:v1 alone", tags)
	}
	if len(conflicts) != 1 {
		t.Fatalf("conflicts %v", conflicts)
	}
}

// Tags keep their case: :V1 and :v1 are two tags (a pod naming one does not find the
// other), not a duplicate; the registry's host alone is case-insensitive.
func TestTagsDifferingInCaseAreTwoTags(t *testing.T) {
	text := "apiVersion: imagepin.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: s}\nspec: {nodeSelector: {}, pinnedImages: [\"quay.io/x/a:V1@" + d1 + "\", \"quay.io/x/a:v1@" + d1 + "\"]}"
	res, err := ParseSetFile("s.yaml", []byte(text))
	if err != nil {
		t.Fatalf("two tags differing in case refused: %v", err)
	}
	if len(res.Sets) != 1 || len(res.Sets[0].Tags) != 2 || len(res.Sets[0].Images) != 1 {
		t.Fatalf("sets %+v, want one image with two tags", res.Sets)
	}
	dup := "apiVersion: imagepin.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: s}\nspec: {nodeSelector: {}, pinnedImages: [\"Quay.io/x/a:v1@" + d1 + "\", \"quay.io/x/a:v1@" + d1 + "\"]}"
	if _, err := ParseSetFile("s.yaml", []byte(dup)); err == nil || !strings.Contains(err.Error(), "duplicates spec.pinnedImages[0]") {
		t.Fatalf("the same tag with the host in another case: %v, want a duplicate", err)
	}
}
