package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/imagepin/imagepin/test/goals"
)

// goalNodes are the node counts of the sharing goals, measured on the tree (the
// daemon's way); oneGiBNodes the count of the 1 GiB layer's goal.
var goalNodes = []int{50, 200, 500}

const (
	oneGiBNodes = 500
	oneGiB      = 1 << 30
	// oneGiBScaled is the 1 GiB layer at the bench's scale: its default links are a
	// data centre's divided by 64 (1 Gbit/s to the registry, 10 Gbit/s a node), and so
	// is its default base layer (16 MiB for a 1 GiB OS layer). A 1 GiB layer on 500
	// simulated nodes would need 500 GiB of disk on one machine.
	oneGiBScaled = oneGiB / 64
)

func goalTime(n int) goals.Goal {
	return goals.Goal{Key: fmt.Sprintf("time/%d", n), Name: fmt.Sprintf("sharing at N = %d (the tree): until every node holds the set ÷ one node alone", n), Bound: 1.5, Unit: "×"}
}

func goalUpload(n int) goals.Goal {
	return goals.Goal{Key: fmt.Sprintf("upload/%d", n), Name: fmt.Sprintf("sharing at N = %d (the tree): most uploaded by a node ÷ one copy of the set", n), Bound: 2, Unit: "×"}
}

func goalRegistry(n int) goals.Goal {
	return goals.Goal{Key: fmt.Sprintf("registry/%d", n), Name: fmt.Sprintf("sharing at N = %d (the tree): registry egress ÷ one copy of the set", n), Bound: 1.05, Unit: "×"}
}

var goalOneGiB = goals.Goal{Key: "1gib", Name: fmt.Sprintf("one 1 GiB layer to %d nodes (the tree): until every node holds it ÷ one node over its own link", oneGiBNodes), Bound: 2, Unit: "×"}

// scaleGoals are the goals this run measures, each skipped with why when the flags
// leave it out: the sharing goals on the bench's usual set (one large shared layer, many
// small ones), the 1 GiB goal on a set of one layer (oneLayer: -images 1 -layers 0) of
// 1 GiB, or of 16 MiB, 1 GiB at the bench's scale (-base-mib 16, the links' default).
func scaleGoals(counts []int, modes []string, largest int64, oneLayer bool) *goals.Table {
	t := &goals.Table{}
	why := func(n int, oneGiBSet bool) string {
		switch {
		case !slices.Contains(modes, "tree"):
			return "-modes has no tree"
		case !slices.Contains(counts, n):
			return fmt.Sprintf("-nodes has no %d", n)
		case oneGiBSet && !oneLayer:
			return "the set is not one layer (-images 1 -layers 0)"
		case oneGiBSet && largest < oneGiBScaled:
			return fmt.Sprintf("the layer is %.0f MiB, less than 1 GiB at the bench's scale, 16 MiB (-base-mib 16)", float64(largest)/(1<<20))
		case !oneGiBSet && oneLayer:
			return "the set is the 1 GiB layer's, not the usual one"
		}
		return ""
	}
	for _, n := range goalNodes {
		for _, g := range []goals.Goal{goalTime(n), goalUpload(n), goalRegistry(n)} {
			if w := why(n, false); w != "" {
				t.Skip(g, w)
			} else {
				t.Add(g)
			}
		}
	}
	if w := why(oneGiBNodes, true); w != "" {
		t.Skip(goalOneGiB, w)
	} else {
		t.Add(goalOneGiB)
	}
	return t
}

// failedRun is the mode and N of the run that stopped on an error (n 0: none).
type failedRun struct {
	mode string
	n    int
}

// recordGoals gives t the tree's figures: for each N whose runs all finished (a failed
// run leaves its N, and every N if it was one node alone's, not run), the medians of
// its runs, and the machine's busy share over them.
func recordGoals(t *goals.Table, results map[string]map[int][]result, setBytes, largestLayer int64, failed failedRun) {
	tree := results["tree"]
	alone := median(tooks(tree[1]))
	if failed.n == 1 || alone == 0 || setBytes == 0 {
		return
	}
	copyMiB := fmt.Sprintf("one copy of the set: %.2f MiB", float64(setBytes)/(1<<20))
	for n, rs := range tree {
		if n == 1 || len(rs) == 0 || failed == (failedRun{"tree", n}) {
			continue
		}
		med := median(tooks(rs))
		var egress, up, busy []float64
		done := n
		for _, r := range rs {
			egress = append(egress, float64(r.egress)/float64(setBytes))
			up = append(up, float64(r.maxUp)/float64(setBytes))
			busy = append(busy, r.busy)
			done = min(done, r.done)
		}
		missed := ""
		if done < n {
			missed = fmt.Sprintf("%d of %d nodes held the set within %s", done, n, *timeout)
		}
		runs := "1 run"
		if len(rs) > 1 {
			runs = fmt.Sprintf("%d runs", len(rs))
		}
		if *slow != 1 {
			runs += fmt.Sprintf(", links slowed %g×", *slow)
		}
		m := func(v float64, detail, baseline string) goals.Measurement {
			return goals.Measurement{Value: v, Detail: strings.TrimPrefix(detail+"; "+runs, "; "), Baseline: baseline, Missed: missed, Busy: goals.Median(busy), BusyKnown: true}
		}
		timeM := m(float64(med)/float64(alone), fmt.Sprintf("%.2f s", med.Seconds()), fmt.Sprintf("one node alone: %.2f s", alone.Seconds()))
		t.Measured(goalTime(n), timeM)
		t.Measured(goalUpload(n), m(goals.Median(up), "", copyMiB))
		t.Measured(goalRegistry(n), m(goals.Median(egress), "", copyMiB))
		if n == oneGiBNodes {
			oneM := timeM
			if largestLayer < oneGiB {
				oneM.Detail += fmt.Sprintf("; a %.0f MiB layer: 1 GiB scaled 1/64 with the links", float64(largestLayer)/(1<<20))
			}
			t.Measured(goalOneGiB, oneM)
		}
	}
}
