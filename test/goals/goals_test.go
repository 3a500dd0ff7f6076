package goals

import (
	"strings"
	"testing"
)

var (
	ratio = Goal{Key: "ratio", Name: "time ÷ one node", Bound: 1.5, Unit: "×"}
	speed = Goal{Key: "speed", Name: "seed ÷ sha256sum", Bound: 0.8, AtLeast: true, Unit: "×"}
	secs  = Goal{Key: "secs", Name: "disk check", Bound: 1, Unit: "s"}
)

// Which fact wins: no measurement, then a machine over BusyBound % busy, then a miss
// named outright, then the figure against the bound (the bound itself meets it).
func TestGoalsVerdict(t *testing.T) {
	for _, c := range []struct {
		name     string
		g        Goal
		m        Measurement
		measured bool
		want     string
	}{
		{"not measured", ratio, Measurement{}, false, NotRun},
		{"not measured, a stale figure ignored", ratio, Measurement{Value: 1}, false, NotRun},
		{"at most, under", ratio, Measurement{Value: 1.2}, true, Met},
		{"at most, the bound itself", ratio, Measurement{Value: 1.5}, true, Met},
		{"at most, over", ratio, Measurement{Value: 1.51}, true, NotMet},
		{"at least, over", speed, Measurement{Value: 3.2}, true, Met},
		{"at least, the bound itself", speed, Measurement{Value: 0.8}, true, Met},
		{"at least, under", speed, Measurement{Value: 0.27}, true, NotMet},
		{"seconds, over", secs, Measurement{Value: 2.7}, true, NotMet},
		{"missed whatever the figure", ratio, Measurement{Value: 1, Missed: "not every node within 10m"}, true, NotMet},
		{"busy 80 % counts", ratio, Measurement{Value: 1.2, Busy: 0.80, BusyKnown: true}, true, Met},
		{"busy 81 %, met figure", ratio, Measurement{Value: 1.2, Busy: 0.81, BusyKnown: true}, true, NotCounting},
		{"busy 98 %, missed figure", ratio, Measurement{Value: 5.3, Busy: 0.98, BusyKnown: true}, true, NotCounting},
		{"busy 98 %, a miss named", ratio, Measurement{Missed: "timed out", Busy: 0.98, BusyKnown: true}, true, NotCounting},
		{"busy not known", ratio, Measurement{Value: 1.2, Busy: 0.99}, true, Met},
	} {
		if got := Verdict(c.g, c.m, c.measured); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// Every goal added prints one row, in the order added: measured ones with their figure,
// baseline, bound, verdict and busy share; skipped ones with why, a figure measured for
// them after all left out; the rest as not run for an error. A figure for a goal never
// added makes no row.
func TestGoalsTableRows(t *testing.T) {
	var tb Table
	tb.Add(ratio)
	tb.Add(speed)
	tb.Add(secs)
	tb.Add(ratio) // once only
	upload := Goal{Key: "up", Name: "most uploaded ÷ set", Bound: 2, Unit: "×"}
	tb.Skip(upload, "-nodes has no 500")
	tb.Measured(ratio, Measurement{Value: 5.29, Detail: "94.69 s", Baseline: "one node alone: 17.90 s", Busy: 0.98, BusyKnown: true})
	tb.Measured(secs, Measurement{Value: 0.69, Baseline: "a connection per image: 2.70 s", Busy: 0.54, BusyKnown: true})
	rss := Goal{Key: "rss", Name: "seed RSS", Bound: 64, Unit: "MiB"}
	tb.Add(rss)
	tb.Measured(rss, Measurement{Value: 39.2, Baseline: "cp: 2.1 MiB"})
	p3 := Goal{Key: "p3", Name: "disk check, 500 images", Bound: 1, Unit: "s"}
	tb.Skip(p3, "-cost-images 200, not 500")
	// A size the goal does not name, and a goal not of this table.
	tb.Measured(p3, Measurement{Value: 0.3})
	tb.Measured(Goal{Key: "p6-250", Name: "250 images", Bound: 1, Unit: "×"}, Measurement{Value: 1.2})
	var out strings.Builder
	tb.Print(&out)
	t.Logf("\n%s", out.String())
	var rows []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "| ") && !strings.HasPrefix(l, "| goal | measured") {
			rows = append(rows, l)
		}
	}
	want := []string{
		"| time ÷ one node | 5.290× (94.69 s) | one node alone: 17.90 s | ≤ 1.5× | not counting | 98 % (over 80 %) |",
		"| seed ÷ sha256sum | not run: stopped on an error before this figure | — | ≥ 0.8× | not run | — |",
		"| disk check | 0.69 s | a connection per image: 2.70 s | ≤ 1 s | yes | 54 % |",
		"| most uploaded ÷ set | not run: -nodes has no 500 | — | ≤ 2× | not run | — |",
		"| seed RSS | 39.2 MiB | cp: 2.1 MiB | ≤ 64 MiB | yes | — |",
		"| disk check, 500 images | not run: -cost-images 200, not 500 | — | ≤ 1 s | not run | — |",
	}
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d:\n%s", len(rows), len(want), strings.Join(rows, "\n"))
	}
	for i := range want {
		if rows[i] != want[i] {
			t.Errorf("row %d:\n got %s\nwant %s", i, rows[i], want[i])
		}
	}
}
