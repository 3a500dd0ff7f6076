package agent

import (
	"sort"

	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/status"
)

func sortSets(s []pinset.Set) { sort.Slice(s, func(i, j int) bool { return s[i].Name < s[j].Name }) }

func sortStrings(s []string) { sort.Strings(s) }

func sortFileErrors(e []status.FileError) {
	sort.Slice(e, func(i, j int) bool { return e[i].File < e[j].File })
}
