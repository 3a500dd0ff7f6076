package crio

import "strings"

// Matches reports whether CRI-O would pin an image named name with these patterns,
// as CRI-O compiles them (internal/storage CompileRegexpsForPinnedImages): "*kw*" and
// "prefix*" match anywhere in the name (CRI-O's regexps are not anchored at the start),
// anything else must equal the name; all case-insensitively.
func Matches(patterns []string, name string) bool {
	lname := strings.ToLower(name)
	for _, p := range patterns {
		lp := strings.ToLower(p)
		switch {
		case ValidPattern(p) != nil:
			continue
		case strings.HasPrefix(lp, "*") && strings.HasSuffix(lp, "*"):
			if strings.Contains(lname, lp[1:len(lp)-1]) {
				return true
			}
		case strings.HasSuffix(lp, "*"):
			if strings.Contains(lname, lp[:len(lp)-1]) {
				return true
			}
		default:
			if lname == lp {
				return true
			}
		}
	}
	return false
}
