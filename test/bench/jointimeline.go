package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// joinPhases are a joining node's imagepind log lines marking its way to its startup
// taint's removal: the first (or last) line containing msg.
var joinPhases = []struct {
	name, msg string
	last      bool
}{
	{"imagepind starts", "imagepind starting", false},
	{"its sets from the API", "set from the API written", true},
	{"pins written", `msg="pins written" patterns=`, false},
	{"first image pulled", "msg=pulled", false},
	{"last image pulled", "msg=pulled", true},
	{"sets Ready", `msg="set Ready"`, true},
	{"last pinned tag held", "tag pre-loaded as its pinned digest", true},
	{"PinnedImagesReady True written", "node condition PinnedImagesReady True", false},
}

// joinTimes are one join's phases, from its kubelet's start.
type joinTimes map[string]time.Duration

// untaintWatch records, as the API server's watch delivers them, when each Node lost
// the startup taint after carrying it (the aggregator logs whole seconds).
type untaintWatch struct {
	mu        sync.Mutex
	tainted   map[string]bool
	untainted map[string]time.Time
}

func watchUntaint(ctx context.Context, cs kubernetes.Interface) (*untaintWatch, error) {
	w, err := cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	u := &untaintWatch{tainted: map[string]bool{}, untainted: map[string]time.Time{}}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			now := time.Now()
			has := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == benchTaint })
			u.mu.Lock()
			switch {
			case has:
				u.tainted[n.Name] = true
				delete(u.untainted, n.Name)
			case u.tainted[n.Name] && u.untainted[n.Name].IsZero():
				u.untainted[n.Name] = now
			}
			u.mu.Unlock()
		}
	}()
	return u, nil
}

// at is when name lost its taint (zero: not yet).
func (u *untaintWatch) at(name string) time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.untainted[name]
}

// readJoin reads a joining node's phases from its imagepind log, and the taint's removal.
func readJoin(logPath string, start, untainted time.Time) joinTimes {
	data, _ := os.ReadFile(logPath)
	lines := strings.Split(string(data), "\n")
	jt := joinTimes{}
	for _, p := range joinPhases {
		for _, l := range lines {
			if !strings.Contains(l, p.msg) {
				continue
			}
			t, ok := lineTime(l, start)
			if !ok {
				continue
			}
			jt[p.name] = t.Sub(start)
			if !p.last {
				break
			}
		}
	}
	if !untainted.IsZero() {
		jt["startup taint gone (watch)"] = untainted.Sub(start)
	}
	return jt
}

// printJoinTimeline prints the joins' phases: the median and each run, in ms after the
// kubelet started.
func printJoinTimeline(joins []joinTimes) {
	fmt.Printf("Timeline of the node joining with the registry gone (ms after its kubelet started; median, then each run):\n\n| phase | median | runs |\n|---|---|---|\n")
	names := []string{}
	for _, p := range joinPhases {
		names = append(names, p.name)
	}
	names = append(names, "startup taint gone (watch)")
	for _, name := range names {
		var ds []time.Duration
		var each []string
		for _, j := range joins {
			if d, ok := j[name]; ok {
				ds = append(ds, d)
				each = append(each, fmt.Sprint(d.Milliseconds()))
			}
		}
		if len(ds) > 0 {
			fmt.Printf("| %s | %d | %s |\n", name, median(ds).Milliseconds(), strings.Join(each, ", "))
		}
	}
	fmt.Println()
}
