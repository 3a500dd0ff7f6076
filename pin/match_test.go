package pin

import "testing"

// CRI-O's pattern rules (internal/storage CompileRegexpsForPinnedImages), and the
// compiled Matcher giving the same answer as Matches on every case.
func TestMatchesAndMatcherAgree(t *testing.T) {
	patterns := []string{"quay.io/ocp/release@sha256:aaaa", "registry.example/admin*", "*pause*", "Quay.io/Mixed/Case:1", "*", "bad pattern"}
	for name, want := range map[string]bool{
		"quay.io/ocp/release@sha256:aaaa":      true,
		"quay.io/ocp/release@sha256:aaab":      false,
		"registry.example/admin/tool:1":        true,
		"mirror/registry.example/admin-x":      true, // not anchored at the start
		"k8s.gcr.io/pause:3.9":                 true,
		"quay.io/mixed/case:1":                 true,  // case-insensitive
		"docker.io/library/busybox:1":          false, // a bare "*" is invalid and skipped
		"quay.io/ocp/release@sha256:aaaa-more": false,
	} {
		if got := Matches(patterns, name); got != want {
			t.Errorf("Matches(%q) = %v, want %v", name, got, want)
		}
		if got := NewMatcher(patterns).Match(name); got != want {
			t.Errorf("Matcher(%q) = %v, want %v", name, got, want)
		}
	}
}
