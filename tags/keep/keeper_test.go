package keep

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/pullcreds"
)

var (
	d1 = digest.FromString("one")

	tag = pinset.Tag{Name: "quay.io/x/a:v1", Image: "quay.io/x/a@" + d1.String()}
)

// fakeCRI is CRI-O's image store: names to image IDs; a pull of a tag names the image
// the mirror (or a registry) gives for it.
type fakeCRI struct {
	names  map[string]string
	serves map[string]string // tag → image ID a pull gives
	pulls  []string
}

func (f *fakeCRI) ImageStatus(_ context.Context, ref string) (cri.Image, error) {
	id, ok := f.names[ref]
	return cri.Image{Present: ok, ID: id}, nil
}

func (f *fakeCRI) PullImage(_ context.Context, ref string, auth *pullcreds.Auth) (string, error) {
	f.pulls = append(f.pulls, ref)
	if auth != nil {
		return "", errors.New("credentials sent with a tag's pull")
	}
	id, ok := f.serves[ref]
	if !ok {
		return "", errors.New("manifest unknown")
	}
	f.names[ref] = id
	return id, nil
}

// A tag is pulled once its digest is on the node, and not again while CRI-O holds it as
// that image; a pull that gives another image (the registry's moved tag) is an error;
// Lookup answers only wanted tags.
func TestPullsMakeCRIOHoldTheTag(t *testing.T) {
	f := &fakeCRI{names: map[string]string{}, serves: map[string]string{tag.Name: "id1"}}
	k := New(Config{}, &Pulls{CRI: f}, nil, logrus.New())
	k.Want([]pinset.Tag{tag})
	ctx := context.Background()
	if done := k.Pass(ctx); done || len(f.pulls) != 0 {
		t.Fatalf("the digest is not on the node: done %v, pulls %v", done, f.pulls)
	}
	f.names[tag.Image] = "id1"
	if done := k.Pass(ctx); !done || len(f.pulls) != 1 || !k.Held(tag) {
		t.Fatalf("done %v, pulls %v, held %v", k.Pass(ctx), f.pulls, k.Held(tag))
	}
	k.Pass(ctx)
	if len(f.pulls) != 1 {
		t.Fatalf("pulled again while held: %v", f.pulls)
	}
	if d, ok := k.Lookup("quay.io/x/a", "v1"); !ok || d != d1 {
		t.Fatalf("lookup: %s %v", d, ok)
	}
	if _, ok := k.Lookup("quay.io/x/a", "latest"); ok {
		t.Fatal("an unpinned tag looked up")
	}

	// The tag taken from the registry, where it moved: reported, and tried again.
	f.names[tag.Name] = "id2"
	f.serves[tag.Name] = "id2"
	if done := k.Pass(ctx); done || k.Held(tag) || len(k.Faults()) != 1 || !strings.Contains(k.Faults()[0], "did not come from the node-local mirror") {
		t.Fatalf("faults %v", k.Faults())
	}
	k.Want(nil)
	if _, ok := k.Lookup("quay.io/x/a", "v1"); ok {
		t.Fatal("a tag no set pins looked up")
	}
}

type fakeRuntime struct {
	held    map[string]bool
	forgot  [][]pinset.Tag
	failing bool
}

func (f *fakeRuntime) Ensure(_ context.Context, t pinset.Tag) (bool, error) {
	if f.failing {
		return false, errors.New("down")
	}
	return f.held[t.Name], nil
}

func (f *fakeRuntime) Forget(_ context.Context, want []pinset.Tag) error {
	f.forgot = append(f.forgot, want)
	return nil
}

func TestKeeperTellsChanges(t *testing.T) {
	rt := &fakeRuntime{held: map[string]bool{tag.Name: true}}
	k := New(Config{}, rt, nil, logrus.New())
	changes := 0
	k.OnChange = func() { changes++ }
	k.Want([]pinset.Tag{tag})
	ctx := context.Background()
	k.Pass(ctx)
	k.Pass(ctx)
	if changes != 1 || !k.Held(tag) {
		t.Fatalf("changes %d", changes)
	}
	rt.failing = true
	k.Pass(ctx)
	if changes != 2 || k.Held(tag) || len(k.Faults()) != 1 {
		t.Fatalf("changes %d faults %v", changes, k.Faults())
	}
	if len(rt.forgot) != 3 || len(rt.forgot[2]) != 1 {
		t.Fatalf("forget: %v", rt.forgot)
	}
}

// A set moves a held tag to another digest: the tag is not held (nor counted so) until
// a pass makes the runtime hold it as the new digest, and the fault of the old digest
// is not reported for the new one.
func TestMovedTagIsNotHeldUntilAPassHoldsIt(t *testing.T) {
	rt := &fakeRuntime{held: map[string]bool{tag.Name: true}}
	k := New(Config{}, rt, nil, logrus.New())
	k.Want([]pinset.Tag{tag})
	ctx := context.Background()
	k.Pass(ctx)
	if !k.Held(tag) {
		t.Fatal("not held after a pass")
	}
	moved := pinset.Tag{Name: tag.Name, Image: "quay.io/x/a@" + digest.FromString("two").String()}
	k.Want([]pinset.Tag{moved})
	if k.Held(moved) {
		t.Fatalf("%s counted held as %s before any pass made it so (it was held as %s)", moved.Name, moved.Image, tag.Image)
	}
	k.Pass(ctx)
	if !k.Held(moved) || k.Held(tag) {
		t.Fatalf("after a pass: held as the new digest %v, as the old %v", k.Held(moved), k.Held(tag))
	}

	rt.failing = true
	k.Pass(ctx)
	k.Want([]pinset.Tag{tag})
	if f := k.Faults(); len(f) != 0 {
		t.Fatalf("faults %q of the digest no longer wanted", f)
	}
}

// arrivingRuntime holds a tag once its image has arrived (a pull of the digest ended).
type arrivingRuntime struct {
	mu      sync.Mutex
	arrived map[string]bool
	passes  int
}

func (r *arrivingRuntime) Ensure(_ context.Context, t pinset.Tag) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.passes++
	return r.arrived[t.Image], nil
}

func (r *arrivingRuntime) Forget(context.Context, []pinset.Tag) error { return nil }

// A tag whose digest is not on the node waits; when the digest's pull ends (Arrived),
// the tag is made at once, not at the next retry: a joining node's PinnedImagesReady
// waits for its tags (TagsNotHeld), and with it the startup taint. An image no tag
// waits for wakes nothing.
func TestATagIsMadeAsSoonAsItsDigestArrives(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rt := &arrivingRuntime{arrived: map[string]bool{}}
	k := New(Config{Retry: time.Hour}, rt, clk, logrus.New())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { k.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	k.Want([]pinset.Tag{tag})
	waitFor := func(what string, f func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if f() {
				return
			}
		}
		t.Fatalf("timed out waiting for %s", what)
	}
	passes := func() int { rt.mu.Lock(); defer rt.mu.Unlock(); return rt.passes }
	waitFor("a pass finding the digest missing", func() bool { return passes() >= 1 && clk.HasWaiters() })
	time.Sleep(20 * time.Millisecond) // the wake of Want, if the first pass had the tag already
	idle := passes()
	k.Arrived("quay.io/x/b@" + d1.String())
	time.Sleep(20 * time.Millisecond)
	if n := passes(); n != idle {
		t.Fatalf("%d passes: an image no tag waits for woke the keeper", n)
	}
	rt.mu.Lock()
	rt.arrived[tag.Image] = true
	rt.mu.Unlock()
	k.Arrived(tag.Image)
	waitFor("the tag held without the retry's hour passing", func() bool { return k.Held(tag) })
}
