// Package goals is the Goals table that ends each bench command's output: every goal
// the command can measure, what this run measured for it (the median of its runs),
// what that is compared with, the goal's bound, whether it is met, and how busy the
// machine's CPU was meanwhile when the bench knows it. Whether a goal is met is
// decided here, once, for every bench: a goal with no measurement was not run, one
// measured while the machine was more than BusyBound % busy does not count.
package goals

import (
	"fmt"
	"io"
)

// BusyBound is the machine's CPU busy share (%) above which a measurement measures the
// machine, not imagepin: it does not count.
const BusyBound = 80

// Counts says whether a measurement made while the machine's CPU was busy this share
// of the time (0 to 1) counts.
func Counts(busy float64) bool { return busy*100 <= BusyBound }

// Goal is one goal: a bound on one figure.
type Goal struct {
	Key  string // unique in its table
	Name string // the goal in words
	// Bound is the goal's value; the figure must be at most it, or at least it with
	// AtLeast.
	Bound   float64
	AtLeast bool
	Unit    string // "×", "s" or "MiB"
}

// Measurement is what a run measured for a goal.
type Measurement struct {
	Value    float64 // the median of the runs made, in the goal's unit
	Detail   string  // what Value is made of, printed after it (optional)
	Baseline string  // what Value is compared with, with its measured value
	// Missed says the goal is not met whatever Value says (a run that did not finish
	// within its bound, a taint never removed).
	Missed string
	// Busy is the machine's CPU busy share (0 to 1) during the measurement, when
	// BusyKnown.
	Busy      float64
	BusyKnown bool
}

// Verdicts in the table's "met?" column.
const (
	Met         = "yes"
	NotMet      = "no"
	NotRun      = "not run"
	NotCounting = "not counting"
)

// Verdict decides whether a goal is met by m (measured: there is a measurement). A
// goal measured while the machine was more than BusyBound % busy does not count,
// whatever the figure.
func Verdict(g Goal, m Measurement, measured bool) string {
	switch {
	case !measured:
		return NotRun
	case m.BusyKnown && !Counts(m.Busy):
		return NotCounting
	case m.Missed != "":
		return NotMet
	case g.AtLeast && m.Value >= g.Bound, !g.AtLeast && m.Value <= g.Bound:
		return Met
	}
	return NotMet
}

// Table collects the measurements of a command's goals, and prints them.
type Table struct {
	goals   []Goal
	got     map[string]Measurement
	skipped map[string]string
}

// Add lists g in the table, in the order added; a goal never measured prints as not
// run. A command adds every goal it can measure before it measures any: the table
// has those rows and no others.
func (t *Table) Add(g Goal) {
	if t.has(g.Key) {
		return
	}
	t.goals = append(t.goals, g)
}

func (t *Table) has(key string) bool {
	for _, g := range t.goals {
		if g.Key == key {
			return true
		}
	}
	return false
}

// Skip says why g is not run in this command as invoked (its section not selected, its
// size not among the flags'): a figure measured for it later is not its.
func (t *Table) Skip(g Goal, why string) {
	t.Add(g)
	if t.skipped == nil {
		t.skipped = map[string]string{}
	}
	t.skipped[g.Key] = why
}

// Measured records what the run measured for g. A goal not in the table, or skipped,
// is not one of this run's: its figure is left out (a section measures more sizes than
// its goal names, or a size the goal does not).
func (t *Table) Measured(g Goal, m Measurement) {
	if !t.has(g.Key) || t.skipped[g.Key] != "" {
		return
	}
	if t.got == nil {
		t.got = map[string]Measurement{}
	}
	t.got[g.Key] = m
}

// Print writes the table in markdown.
func (t *Table) Print(w io.Writer) {
	fmt.Fprintf(w, "## Goals\n\n")
	fmt.Fprintf(w, "Each goal this command measures: the figure this run measured (the median of its runs), what it is compared with, the goal, and whether it is met. "+
		"Not run: its section was not selected, or stopped on an error before it measured it. "+
		"Not counting: the machine's CPU was more than %d %% busy during it, so it measures the machine, not imagepin.\n\n", BusyBound)
	fmt.Fprintf(w, "| goal | measured | baseline | goal value | met? | machine CPU busy |\n|---|---|---|---|---|---|\n")
	for _, g := range t.goals {
		m, ok := t.got[g.Key]
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", g.Name, t.measured(g, m, ok), orDash(m.Baseline), bound(g), Verdict(g, m, ok), busy(m, ok))
	}
	fmt.Fprintln(w)
}

func (t *Table) measured(g Goal, m Measurement, ok bool) string {
	if !ok {
		if why := t.skipped[g.Key]; why != "" {
			return "not run: " + why
		}
		return "not run: stopped on an error before this figure"
	}
	s := value(g.Unit, m.Value)
	if m.Missed != "" {
		s = m.Missed
	}
	if m.Detail != "" {
		s += " (" + m.Detail + ")"
	}
	return s
}

func value(unit string, v float64) string {
	switch unit {
	case "×":
		return fmt.Sprintf("%.3f×", v)
	case "MiB":
		return fmt.Sprintf("%.1f MiB", v)
	}
	return fmt.Sprintf("%.2f %s", v, unit)
}

func bound(g Goal) string {
	op := "≤"
	if g.AtLeast {
		op = "≥"
	}
	if g.Unit == "×" {
		return fmt.Sprintf("%s %g×", op, g.Bound)
	}
	return fmt.Sprintf("%s %g %s", op, g.Bound, g.Unit)
}

func busy(m Measurement, ok bool) string {
	if !ok || !m.BusyKnown {
		return "—"
	}
	if !Counts(m.Busy) {
		return fmt.Sprintf("%.0f %% (over %d %%)", m.Busy*100, BusyBound)
	}
	return fmt.Sprintf("%.0f %%", m.Busy*100)
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}
