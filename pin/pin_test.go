package pin

import "testing"

// A list that did not change comes back as the same slice; a changed one as a copy the
// caller's later edits cannot reach.
func TestStable(t *testing.T) {
	a := []string{"x", "y"}
	prev := Stable(nil, a)
	if &prev[0] == &a[0] {
		t.Fatal("a new list must be copied")
	}
	if got := Stable(prev, []string{"x", "y"}); &got[0] != &prev[0] {
		t.Fatal("the same patterns came back as another slice")
	}
	if got := Stable(prev, []string{"x", "z"}); got[1] != "z" || &got[0] == &prev[0] {
		t.Fatalf("a changed list came back as %v (same slice: %v)", got, &got[0] == &prev[0])
	}
}
