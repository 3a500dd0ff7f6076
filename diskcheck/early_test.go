package diskcheck

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/test/registrytest"
)

// earlyCheck is a check of sets against room bytes under the GC threshold (at 100 %),
// and what it offered to be pulled before its verdict.
func earlyCheck(t *testing.T, f registrytest.Files, room uint64, sets []SetRequest) (Result, []Early) {
	t.Helper()
	chk := New(Config{NodeName: "n1", Multiplier: 2, GCHighThresholdPercent: 100}, resolver(f, registry.Platform{}, nil),
		func(context.Context) (string, error) { return "/var/lib/containers/storage", nil })
	chk.statfs = func(string) (Space, error) { return Space{Capacity: 2 * room, Available: room}, nil }
	var offers []Early
	res, err := chk.Check(context.Background(), sets, func(e Early) { offers = append(offers, e) })
	if err != nil {
		t.Fatal(err)
	}
	return res, offers
}

// When the verdict waits for Range requests, the images of the set whose layers fit the
// room even at the most their Range requests could report are offered for pulling
// first, in the set's order; the verdict then comes on the real sizes. Not when the
// manifests decide alone, nor when more than one set misses images.
func TestEarlyPullsFitTheRoomAtTheirMost(t *testing.T) {
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	var refs []string
	var most, least uint64 // the largest and smallest image's most (a layer each, about alike)
	for _, name := range []string{"early/a", "early/b", "early/c"} {
		l := layer(t, 8<<10)
		refs = append(refs, reg.Host+"/"+reg.Push(name, image(t, l), ""))
		c := layerBytes(t, l)
		m := c + min(1032*c, 1<<32-1)
		most = max(most, m)
		if least == 0 || m < least {
			least = m
		}
	}
	// Room for two images at their most, far more than all three really need.
	room := 2*most + most/2
	res, offers := earlyCheck(t, f, room, []SetRequest{{Name: "s", Missing: refs}})
	if len(offers) != 1 || offers[0].Set != "s" || !slices.Equal(offers[0].Images, refs[:2]) || len(offers[0].Layers[refs[0]]) != 1 {
		t.Fatalf("offers %+v; want the first two images of s", offers)
	}
	if v := res.Verdicts["s"]; !v.Admitted || !strings.Contains(v.Condition.Message, "and up to 2 of its images pulled while the check ran") {
		t.Fatalf("verdict %+v", v)
	}
	// An image its registry cannot serve is never offered: its size is not known.
	gone := reg.Host + "/early/gone@sha256:" + strings.Repeat("0", 64)
	if _, offers := earlyCheck(t, f, room, []SetRequest{{Name: "s", Missing: append([]string{gone}, refs...)}}); len(offers) != 1 || !slices.Equal(offers[0].Images, refs[:2]) {
		t.Fatalf("with an image the registry cannot serve: offers %+v; want the first two others", offers)
	}
	// Room for the three at their most: the manifests decide, nothing to offer.
	if res, offers := earlyCheck(t, f, 4*most, []SetRequest{{Name: "s", Missing: refs}}); len(offers) != 0 || !res.Verdicts["s"].Admitted {
		t.Fatalf("plenty of room: offers %+v, %+v", offers, res.Verdicts["s"])
	}
	// Two sets missing images: nothing offered (the room is theirs together).
	if _, offers := earlyCheck(t, f, room, []SetRequest{{Name: "s", Missing: refs[:2]}, {Name: "t", Missing: refs[2:]}}); len(offers) != 0 {
		t.Fatalf("two sets: offers %+v", offers)
	}
	// Less room than any image's most: nothing offered.
	if _, offers := earlyCheck(t, f, least-1, []SetRequest{{Name: "s", Missing: refs}}); len(offers) != 0 {
		t.Fatalf("room for less than one image's most: offers %+v", offers)
	}
}

// A set refused while images of it were pulled before the verdict still counts them:
// they are on the node whatever it says, so the set after it is admitted only in the
// room they leave.
func TestARefusedSetCountsWhatItPulledEarly(t *testing.T) {
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	x, big, y := layer(t, 8<<10), layer(t, 64<<10), layer(t, 8<<10)
	refX := reg.Host + "/" + reg.Push("refused/x", image(t, x), "")
	refBig := reg.Host + "/" + reg.Push("refused/big", image(t, big), "")
	refY := reg.Host + "/" + reg.Push("after/y", image(t, y), "")
	// Random layers do not compress: each needs its floor, 2 × compressed.
	needX, needY := 2*layerBytes(t, x), 2*layerBytes(t, y)
	room := needX + needY - 1 // y fits alone, not beside x; a (x and big) never fits
	sets := []SetRequest{{Name: "a", Missing: []string{refX, refBig}}, {Name: "b", Missing: []string{refY}}}
	res, _ := earlyCheck(t, f, room, sets)
	if res.Verdicts["a"].Admitted || !res.Verdicts["b"].Admitted {
		t.Fatalf("nothing pulled early: a %+v, b %+v", res.Verdicts["a"], res.Verdicts["b"])
	}
	sets[0].Pulling = []string{refX}
	res, offers := earlyCheck(t, f, room, sets)
	if a := res.Verdicts["a"]; a.Admitted || !strings.Contains(a.Condition.Message, "up to 1 of its images pulled while the check ran") {
		t.Fatalf("a %+v", a)
	}
	if res.Verdicts["b"].Admitted || len(offers) != 0 {
		t.Fatalf("b admitted beside what a pulled early (%+v); offers %+v", res.Verdicts["b"], offers)
	}
	// The set pulling early comes after the other by name: what it pulls still counts
	// first, so the set before it is not admitted into that room either.
	sets = []SetRequest{{Name: "b", Missing: []string{refY}}, {Name: "c", Missing: []string{refX, refBig}, Pulling: []string{refX}}}
	res, _ = earlyCheck(t, f, room, sets)
	if res.Verdicts["b"].Admitted || res.Verdicts["c"].Admitted {
		t.Fatalf("b admitted before what c pulls early: b %+v, c %+v", res.Verdicts["b"], res.Verdicts["c"])
	}
}
