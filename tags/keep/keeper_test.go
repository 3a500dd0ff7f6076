package keep

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"

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
