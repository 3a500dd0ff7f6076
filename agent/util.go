package agent

import (
	"sort"

	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/status"
)

func sortSets(s []conf.Set) { sort.Slice(s, func(i, j int) bool { return s[i].Name < s[j].Name }) }

func sortStrings(s []string) { sort.Strings(s) }

func sortFileErrors(e []status.FileError) {
	sort.Slice(e, func(i, j int) bool { return e[i].File < e[j].File })
}
