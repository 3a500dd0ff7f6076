package main

import (
	"strings"
	"testing"

	"github.com/imagepin/imagepin/test/goals"
)

// Every goal of the command has its row whatever the flags: the ones the flags leave
// out say why; a figure the preload section measures lands in its runtime's and link's
// row, and a P6 size other than the goal's makes no row.
func TestGoalsBenchRowsFollowTheFlags(t *testing.T) {
	defer func(s, r, l, c string) { *sections, *runtimes, *linkList, *seedSizes = s, r, l, c }(*sections, *runtimes, *linkList, *seedSizes)
	*sections, *runtimes, *linkList, *seedSizes = "preload,large", "cri-o", "loopback,slow", "512"
	tb := benchGoals()
	lo, slow := knownLinks["loopback"], knownLinks["slow"]
	tb.Measured(goalP1("cri-o", lo), goals.Measurement{Value: 1.13, Baseline: "the best raw CRI width (32 wide): 5.87 s"})
	tb.Measured(goalP1("cri-o", slow), goals.Measurement{Value: 1.04})
	tb.Measured(goalP6(250), goals.Measurement{Value: 1.17})
	var out strings.Builder
	tb.Print(&out)
	t.Logf("\n%s", out.String())
	for _, want := range []string{
		"| a join past peers with corrupted stores ÷ a join past healthy peers | not run: measured by `go test ./peers",
		"| node join: its sets Ready → startup taint removed | not run: section cluster-rollout not selected (-sections) |",
		"| P1: a fresh 40-image set on CRI-O, registry on loopback: imagepind ÷ the best raw CRI width | 1.130× | the best raw CRI width (32 wide): 5.87 s | ≤ 1.05× | no |",
		"| P1: a fresh 40-image set on CRI-O, behind the slow link (+25 ms, 4000 KB/s a connection): imagepind ÷ the best raw CRI width | 1.040× | — | ≤ 1.05× | yes |",
		"| P1: a fresh 40-image set on CRI-O, behind the satellite link (+100 ms, 1000 KB/s a connection): imagepind ÷ the best raw CRI width | not run: -links has no satellite |",
		"| P1: a fresh 40-image set on containerd, registry on loopback: imagepind ÷ the best raw CRI width | not run: -runtimes has no containerd |",
		"| P3: disk check, cold, 500 images, registry on loopback | not run: section disk not selected (-sections) |",
		"| P6: a 2000-image set on loopback: imagepind ÷ raw CRI PullImage at imagepind's widest | not run: stopped on an error before this figure |",
		"| seeding a 512 MiB archive: `imagepinctl seed`'s largest RSS | not run: section seed not selected (-sections) |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no row %s", want)
		}
	}
	if rows := strings.Count(out.String(), "\n| ") - 1; rows != 13 { // less the header
		t.Errorf("%d rows, want 13: the corrupt join, 2 of the join, 6 P1, P3, P6, 2 seeding, and no P6 of 250", rows)
	}
}
