package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/imagepin/imagepin/test/goals"
)

// The goals this command measures, each from the section that computes its figure.
var (
	goalCorruptJoin = goals.Goal{Key: "corrupt-join", Name: "a join past peers with corrupted stores ÷ a join past healthy peers", Bound: 1.5, Unit: "×"}
	goalJoinTaint   = goals.Goal{Key: "join-taint", Name: "node join under the startup taint, registry gone: kubelet start → taint removed ÷ the same node's sets Ready from the registry", Bound: 1, Unit: "×"}
	goalReadyTaint  = goals.Goal{Key: "ready-untaint", Name: "node join: its sets Ready → startup taint removed", Bound: 0.5, Unit: "s"}
	goalP3          = goals.Goal{Key: "p3", Name: fmt.Sprintf("P3: disk check, cold, %d images, registry on loopback", p3Images), Bound: 1, Unit: "s"}
)

const (
	p3Images = 500
	p6Images = 2000
)

// goalP1 is P1 on runtime behind link: imagepind ÷ the best raw CRI width.
func goalP1(runtime string, l link) goals.Goal {
	where := "registry on loopback"
	if l.latencyMs > 0 {
		where = fmt.Sprintf("behind the %s link (+%d ms, %d KB/s a connection)", l.name, l.latencyMs, l.rateKBps)
	}
	shown := map[string]string{"cri-o": "CRI-O"}[runtime]
	if shown == "" {
		shown = runtime
	}
	return goals.Goal{Key: "p1/" + runtime + "/" + l.name, Name: fmt.Sprintf("P1: a fresh %d-image set on %s, %s: imagepind ÷ the best raw CRI width", *nImages, shown, where), Bound: 1.05, Unit: "×"}
}

// goalP6 is P6 for a set of n images: imagepind ÷ raw CRI pulls at its widest.
func goalP6(n int) goals.Goal {
	return goals.Goal{Key: fmt.Sprintf("p6/%d", n), Name: fmt.Sprintf("P6: a %d-image set on loopback: imagepind ÷ raw CRI PullImage at imagepind's widest", n), Bound: 1, Unit: "×"}
}

// goalSeedSpeed and goalSeedRSS are seeding an archive of mib MiB: its speed ÷
// sha256sum's over the same archive, and its largest RSS.
func goalSeedSpeed(mib int) goals.Goal {
	return goals.Goal{Key: fmt.Sprintf("seed-speed/%d", mib), Name: fmt.Sprintf("seeding a %d MiB archive: `imagepinctl seed`'s speed ÷ `sha256sum`'s", mib), Bound: 0.8, AtLeast: true, Unit: "×"}
}

func goalSeedRSS(mib int) goals.Goal {
	return goals.Goal{Key: fmt.Sprintf("seed-rss/%d", mib), Name: fmt.Sprintf("seeding a %d MiB archive: `imagepinctl seed`'s largest RSS", mib), Bound: 64, Unit: "MiB"}
}

// benchGoals are every goal this command measures, in the order of the list,
// each skipped with why when the flags leave it out: the sections record what they
// measure (Measured), and the table ends the output.
func benchGoals() *goals.Table {
	t := &goals.Table{}
	// add lists g, skipped for why unless why is "".
	add := func(g goals.Goal, why string) {
		if why == "" {
			t.Add(g)
		} else {
			t.Skip(g, why)
		}
	}
	unless := func(section string) string {
		if want(section) {
			return ""
		}
		return "section " + section + " not selected (-sections)"
	}
	add(goalCorruptJoin, "measured by `go test ./peers -run TestAJoinPastCorruptedPeersSetsThemAsideForEveryBlob`, not by this command")
	add(goalJoinTaint, unless("cluster-rollout"))
	add(goalReadyTaint, unless("cluster-rollout"))
	runtimeList, links := strings.Split(*runtimes, ","), strings.Split(*linkList, ",")
	for _, rt := range []string{"cri-o", "containerd"} {
		for _, name := range []string{"loopback", "slow", "satellite"} {
			why := unless("preload")
			switch {
			case why != "":
			case !slices.Contains(runtimeList, rt):
				why = "-runtimes has no " + rt
			case name != "loopback" && !slices.Contains(links, name): // loopback is always among the links
				why = "-links has no " + name
			}
			add(goalP1(rt, knownLinks[name]), why)
		}
	}
	why := unless("disk")
	if why == "" && *costN != p3Images {
		why = fmt.Sprintf("-cost-images %d, not %d", *costN, p3Images)
	}
	add(goalP3, why)
	why = unless("large")
	if why == "" && !slices.Contains(strings.Split(*largeSizes, ","), strconv.Itoa(p6Images)) {
		why = fmt.Sprintf("-large-sizes has no %d", p6Images)
	}
	add(goalP6(p6Images), why)
	var sizes []int
	for _, s := range strings.Split(*seedSizes, ",") {
		if mib, err := strconv.Atoi(strings.TrimSpace(s)); err == nil {
			sizes = append(sizes, mib)
		}
	}
	if len(sizes) == 0 {
		add(goals.Goal{Key: "seed-speed", Name: "seeding an archive: `imagepinctl seed`'s speed ÷ `sha256sum`'s", Bound: 0.8, AtLeast: true, Unit: "×"}, "-seed-mib has no size")
		add(goals.Goal{Key: "seed-rss", Name: "seeding an archive: `imagepinctl seed`'s largest RSS", Bound: 64, Unit: "MiB"}, "-seed-mib has no size")
	}
	for _, mib := range sizes {
		add(goalSeedSpeed(mib), unless("seed"))
		add(goalSeedRSS(mib), unless("seed"))
	}
	return t
}
