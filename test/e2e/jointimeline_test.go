//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/imagepin/imagepin/test/env"
)

// nodeWatch records, as the API server's watch delivers them, when each Node was first
// seen, turned Ready, had PinnedImagesReady True, and lost the startup taint: the
// times a joining node's timeline is read against (the aggregator logs whole seconds).
type nodeWatch struct {
	mu    sync.Mutex
	times map[string]*nodeTimes
}

type nodeTimes struct {
	registered, ready, condition, untainted time.Time
	tainted                                 bool
}

// watchNodes starts watching every Node until the test ends.
func watchNodes(t *testing.T, cs kubernetes.Interface) *nodeWatch {
	t.Helper()
	w, err := cs.CoreV1().Nodes().Watch(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("watch nodes: %v", err)
	}
	nw := &nodeWatch{times: map[string]*nodeTimes{}}
	go func() {
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			now := time.Now()
			nw.mu.Lock()
			nt := nw.times[n.Name]
			if nt == nil {
				nt = &nodeTimes{registered: now}
				nw.times[n.Name] = nt
			}
			tainted := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == startupTaint })
			if tainted {
				nt.tainted = true
			} else if nt.tainted && nt.untainted.IsZero() {
				nt.untainted = now
			}
			for _, c := range n.Status.Conditions {
				switch {
				case c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && nt.ready.IsZero():
					nt.ready = now
				case string(c.Type) == pinnedImagesReady && c.Status == corev1.ConditionTrue && nt.condition.IsZero():
					nt.condition = now
				}
			}
			nw.mu.Unlock()
		}
	}()
	t.Cleanup(w.Stop)
	return nw
}

func (nw *nodeWatch) of(name string) nodeTimes {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if nt := nw.times[name]; nt != nil {
		return *nt
	}
	return nodeTimes{}
}

// joinPhases are the joining node's imagepind log lines that mark its way to its
// condition: the first (or last) line containing msg.
var joinPhases = []struct {
	name, msg string
	last      bool
}{
	{"imagepind starts", "imagepind starting", false},
	{"its peers from the aggregator", `msg="[peers] peers from the aggregator" peers=`, false},
	{"its sets from the API", "set from the API written", true},
	{"pins written", `msg="pins written" patterns=`, false},
	{"first image pulled", "msg=pulled", false},
	{"last image pulled", "msg=pulled", true},
	{"sets Ready", `msg="set Ready"`, true},
	{"last pinned tag held", "tag pre-loaded as its pinned digest", true},
	{"PinnedImagesReady False written", "node condition PinnedImagesReady False", false},
	{"PinnedImagesReady True written", "node condition PinnedImagesReady True", false},
}

var joinLogTime = regexp.MustCompile(`time="([^"]+)"`)

// logJoinTimeline logs the joining node's timeline, in milliseconds after its kubelet
// started: imagepind's log lines (their own milliseconds) and the watch's times; and
// how long the taint stayed after the sets were Ready. It returns that span (0: not
// known).
func logJoinTimeline(t *testing.T, n *env.ClusterNode, nt nodeTimes) time.Duration {
	t.Helper()
	start := n.Started
	data, _ := os.ReadFile(n.Log)
	lines := strings.Split(string(data), "\n")
	at := map[string]time.Time{}
	for _, p := range joinPhases {
		for _, l := range lines {
			if !strings.Contains(l, p.msg) {
				continue
			}
			m := joinLogTime.FindStringSubmatch(l)
			if m == nil {
				continue
			}
			ts, err := time.Parse("2006-01-02T15:04:05.000Z07:00", m[1])
			if err != nil {
				continue
			}
			at[p.name] = ts
			if !p.last {
				break
			}
		}
	}
	type row struct {
		name string
		at   time.Time
	}
	var rows []row
	for _, p := range joinPhases {
		if ts, ok := at[p.name]; ok {
			rows = append(rows, row{p.name, ts})
		}
	}
	for _, r := range []row{{"Node registered (watch)", nt.registered}, {"Node Ready (watch)", nt.ready},
		{"PinnedImagesReady True seen (watch)", nt.condition}, {"startup taint gone (watch)", nt.untainted}} {
		if !r.at.IsZero() {
			rows = append(rows, r)
		}
	}
	slices.SortStableFunc(rows, func(a, b row) int { return a.at.Compare(b.at) })
	var b strings.Builder
	fmt.Fprintf(&b, "| %-40s | ms after the kubelet started |\n|---|---|\n| %-40s | 0 |\n", "the joining node", "kubelet starts")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %-40s | %d |\n", r.name, r.at.Sub(start).Milliseconds())
	}
	var span time.Duration
	if ready, ok := at["sets Ready"]; ok && !nt.untainted.IsZero() {
		span = nt.untainted.Sub(ready)
		fmt.Fprintf(&b, "sets Ready → startup taint gone: %d ms\n", span.Milliseconds())
	}
	t.Logf("the joining node's timeline:\n%s", b.String())
	return span
}
