package check

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/registry"
)

type fakeRegistry struct {
	mu    sync.Mutex
	tags  map[string]digest.Digest
	down  bool
	asked int
}

func (f *fakeRegistry) ResolveTag(_ context.Context, image string) (registry.Tag, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	if f.down {
		return registry.Tag{}, errors.New("connection refused")
	}
	return registry.Tag{Digest: f.tags[image]}, nil
}

func (f *fakeRegistry) set(image string, d digest.Digest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tags[image] = d
}

// A moved tag is reported while the registry answers and kept while it is gone; moved
// back, or no longer pinned, it goes; each tag is asked when first named, then every
// Every.
func TestMovedTagReportedWhileTheRegistryAnswers(t *testing.T) {
	d1, d2 := digest.FromString("one"), digest.FromString("two")
	tag := pinset.Tag{Name: "quay.io/x/a:v1", Image: "quay.io/x/a@" + d1.String()}
	reg := &fakeRegistry{tags: map[string]digest.Digest{"quay.io/x/a:v1": d1}}
	want := []pinset.Tag{tag}
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	c := New(Config{Every: time.Minute}, reg, func() []pinset.Tag { return want }, clk, logrus.New())
	changes := 0
	c.OnChange = func() { changes++ }
	ctx := context.Background()

	c.Pass(ctx)
	if len(c.Moved()) != 0 || reg.asked != 1 {
		t.Fatalf("unmoved tag: moved %v, asked %d", c.Moved(), reg.asked)
	}
	reg.set("quay.io/x/a:v1", d2)
	c.Pass(ctx)
	if reg.asked != 1 {
		t.Fatal("asked again before Every")
	}
	clk.Step(time.Minute)
	c.Pass(ctx)
	m := c.Moved()
	if len(m) != 1 || m[0].Registry != d2.String() || m[0].Pinned != d1.String() || changes != 1 || m[0].Image() != tag.Image {
		t.Fatalf("moved %+v (changes %d)", m, changes)
	}
	since := m[0].Since

	reg.down = true
	clk.Step(time.Minute)
	c.Pass(ctx)
	if m := c.Moved(); len(m) != 1 || !m[0].Since.Equal(since) || changes != 1 {
		t.Fatalf("with the registry gone: %+v (changes %d)", m, changes)
	}
	reg.down = false
	reg.set("quay.io/x/a:v1", d1)
	clk.Step(time.Minute)
	c.Pass(ctx)
	if len(c.Moved()) != 0 || changes != 2 {
		t.Fatalf("moved back: %+v (changes %d)", c.Moved(), changes)
	}

	reg.set("quay.io/x/a:v1", d2)
	clk.Step(time.Minute)
	c.Pass(ctx)
	if len(c.Moved()) != 1 {
		t.Fatal("moved again: not reported")
	}
	want = nil
	c.Pass(ctx)
	if len(c.Moved()) != 0 || changes != 4 {
		t.Fatalf("no longer pinned: %+v (changes %d)", c.Moved(), changes)
	}
	// A set pinning the tag to the registry's digest now: asked at once, not moved.
	want = []pinset.Tag{{Name: tag.Name, Image: "quay.io/x/a@" + d2.String()}}
	asked := reg.asked
	c.Pass(ctx)
	if reg.asked != asked+1 || len(c.Moved()) != 0 {
		t.Fatalf("the re-pinned tag: asked %d, moved %v", reg.asked-asked, c.Moved())
	}
}
