package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"
)

// phases of imagepind's way to Ready, by the first (or last) log line that marks each.
var phases = []struct {
	name, msg string
	last      bool
}{
	{"pulls before the verdict", "pulling images while the disk check sizes the set", false},
	{"disk check admitted", "disk check admitted the set", false},
	{"pins written", "pins written", false},
	{"pins confirmed", "pins confirmed in effect", false},
	{"first pull done", "msg=pulled", false},
	{"last pull done", "msg=pulled", true},
	{"Ready", `msg="set Ready"`, false},
}

var logTime = regexp.MustCompile(`time="([^"]+)"`)

func timelineKey(runtime, host string) string { return runtime + "/" + host }

// recordTimeline reads one imagepind run's log: when each phase came, from start.
func (b *bench) recordTimeline(n *node, refs []string, start time.Time, logPath string) {
	if b.timelines == nil {
		b.timelines, b.phaseRuns = map[string]string{}, map[string]map[string][]time.Duration{}
	}
	host, _, _ := strings.Cut(refs[0], "/")
	key := timelineKey(n.runtime, host)
	if b.phaseRuns[key] == nil {
		b.phaseRuns[key] = map[string][]time.Duration{}
	}
	data, _ := os.ReadFile(logPath)
	lines := strings.Split(string(data), "\n")
	for _, p := range phases {
		var at time.Time
		for _, l := range lines {
			if !strings.Contains(l, p.msg) {
				continue
			}
			t, ok := lineTime(l, start)
			if !ok {
				continue
			}
			at = t
			if !p.last {
				break
			}
		}
		if !at.IsZero() {
			b.phaseRuns[key][p.name] = append(b.phaseRuns[key][p.name], at.Sub(start))
		}
	}
	var parts []string
	for _, p := range phases {
		if ds := b.phaseRuns[key][p.name]; len(ds) > 0 {
			parts = append(parts, fmt.Sprintf("%s %d ms", p.name, median(ds).Milliseconds()))
		}
	}
	b.timelines[key] = strings.Join(parts, " → ")
}

// firstLogTime is when the first log line containing msg came, from start (0: none).
func firstLogTime(logPath, msg string, start time.Time) time.Duration {
	data, _ := os.ReadFile(logPath)
	for _, l := range strings.Split(string(data), "\n") {
		if !strings.Contains(l, msg) {
			continue
		}
		if t, ok := lineTime(l, start); ok {
			return t.Sub(start)
		}
	}
	return 0
}

// lineTime is a log line's time, if it has one and it is not before start (logrus writes
// milliseconds: a line of start's own millisecond may read up to 1 ms before it).
func lineTime(l string, start time.Time) (time.Time, bool) {
	m := logTime.FindStringSubmatch(l)
	if m == nil {
		return time.Time{}, false
	}
	t, err := time.Parse("2006-01-02T15:04:05.000Z07:00", m[1])
	if err != nil || t.Before(start.Add(-time.Millisecond)) {
		return time.Time{}, false
	}
	return t, true
}
