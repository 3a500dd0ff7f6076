package release

import (
	"slices"
	"testing"
)

func TestMergeKeepsTheSetsOwnFirst(t *testing.T) {
	got := Merge([]string{"b", "a"}, []string{"a", "c", "b", "d"})
	if want := []string{"b", "a", "c", "d"}; !slices.Equal(got, want) {
		t.Fatalf("Merge = %v, want %v", got, want)
	}
	if got := Merge(nil, nil); len(got) != 0 {
		t.Fatalf("Merge of nothing = %v", got)
	}
}

func TestForNodeAddsTheReleaseImageOnControlPlanes(t *testing.T) {
	r := Release{Image: "rel@sha256:1", Components: map[string]string{"c": "c@sha256:2"}}
	worker, _ := r.ForNode(map[string]string{"node-role.kubernetes.io/worker": ""}, "")
	master, _ := r.ForNode(map[string]string{"node-role.kubernetes.io/master": ""}, "")
	if slices.Contains(worker, r.Image) || !slices.Contains(master, r.Image) {
		t.Fatalf("worker %v, master %v", worker, master)
	}
}
