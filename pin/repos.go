package pin

import (
	"sort"
	"strings"

	"github.com/distribution/reference"
)

// Repositories are the repositories of the image references among pin patterns (a
// wildcard pattern names none), normalized ("docker.io/library/x"), sorted: where the
// node-local mirror ([peers]) points the runtime.
func Repositories(patterns []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range patterns {
		if strings.Contains(p, "*") {
			continue
		}
		named, err := reference.ParseNormalizedNamed(p)
		if err != nil || seen[named.Name()] {
			continue
		}
		seen[named.Name()] = true
		out = append(out, named.Name())
	}
	sort.Strings(out)
	return out
}
