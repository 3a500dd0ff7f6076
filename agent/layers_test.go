package agent

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/diskcheck"
	"github.com/imagepin/imagepin/pullcreds"
	"github.com/imagepin/imagepin/status"
)

// layerDisk admits every set and names each image's layers as the real check does from
// the manifests (an image it has no layers for is named with none).
type layerDisk struct{ layers map[string][]string }

func (d *layerDisk) Check(_ context.Context, sets []diskcheck.SetRequest, _ func(diskcheck.Early)) (diskcheck.Result, error) {
	res := diskcheck.Result{Verdicts: map[string]diskcheck.Verdict{}}
	for _, s := range sets {
		v := diskcheck.Verdict{Admitted: true, Layers: map[string][]string{},
			Condition: status.Condition{Type: status.ConditionDiskChecked, Status: status.True, Reason: status.ReasonSpaceAvailable, Message: "fits"}}
		for _, ref := range s.Missing {
			if l, ok := d.layers[ref]; ok {
				v.Layers[ref] = l
			}
		}
		res.Verdicts[s.Name] = v
	}
	return res, nil
}

// gatedPulls holds every pull until the test ends it (gatedPulls.end), recording the
// order pulls started in and how many ran at once.
type gatedPulls struct {
	Runtime
	mu      sync.Mutex
	started []string
	running map[string]bool
	most    int
	gates   map[string]chan error
	open    map[string]bool // gates closed: every pull of the image goes through
}

func newGatedPulls(rt Runtime) *gatedPulls {
	return &gatedPulls{Runtime: rt, running: map[string]bool{}, gates: map[string]chan error{}, open: map[string]bool{}}
}

func (g *gatedPulls) gate(ref string) chan error {
	if g.gates[ref] == nil {
		g.gates[ref] = make(chan error, 1)
	}
	return g.gates[ref]
}

func (g *gatedPulls) PullImage(ctx context.Context, ref string, auth *pullcreds.Auth) (string, error) {
	g.mu.Lock()
	g.started = append(g.started, ref)
	g.running[ref] = true
	g.most = max(g.most, len(g.running))
	gate := g.gate(ref)
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		delete(g.running, ref)
		g.mu.Unlock()
	}()
	select {
	case err := <-gate:
		if err != nil {
			return "", err
		}
	case <-ctx.Done():
		return "", ctx.Err()
	}
	return g.Runtime.PullImage(ctx, ref, auth)
}

// end ends the pull of ref (running or the next one) with err.
func (g *gatedPulls) end(ref string, err error) {
	g.mu.Lock()
	gate := g.gate(ref)
	g.mu.Unlock()
	gate <- err
}

// endAll lets every pull, running and to come, succeed.
func (g *gatedPulls) endAll(refs []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, ref := range refs {
		if !g.open[ref] {
			g.open[ref] = true
			close(g.gate(ref))
		}
	}
}

func (g *gatedPulls) snapshot() (started, running []string, most int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for ref := range g.running {
		running = append(running, ref)
	}
	return slices.Clone(g.started), running, g.most
}

// waitRunning waits until n pulls run at once, then a little longer, and says which.
func (g *gatedPulls) waitRunning(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, running, _ := g.snapshot()
		if len(running) == n {
			// Nothing more may start: give the loop the time to try.
			time.Sleep(100 * time.Millisecond)
			if _, again, _ := g.snapshot(); len(again) == n {
				slices.Sort(again)
				return again
			}
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pulls running (%v), want %d", len(running), running, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sharedBase is n images on one base layer, one layer of their own each.
func sharedBase(prefix string, n int) ([]string, map[string][]string) {
	var refs []string
	layers := map[string][]string{}
	for i := range n {
		ref := img(fmt.Sprintf("%s%d", prefix, i), i)
		refs = append(refs, ref)
		layers[ref] = []string{"sha256:base", fmt.Sprintf("sha256:%s-own-%d", prefix, i)}
	}
	return refs, layers
}

func orderedHarness(t *testing.T, layers map[string][]string, refs ...string) (*harness, *gatedPulls) {
	h := newHarness(t)
	h.cfg.PullConcurrency = 16
	h.cfg.OrderByLayers = true
	h.disk = &layerDisk{layers: layers}
	h.available(refs...)
	g := newGatedPulls(h.rt)
	h.runtime = g
	return h, g
}

// Ten images on one base layer: the first pulls alone; the other nine start, together,
// once it ended (the layer is then in the runtime's storage).
func TestSharedLayerPulledOnce(t *testing.T) {
	refs, layers := sharedBase("app", 10)
	h, g := orderedHarness(t, layers, refs...)
	h.start()
	h.writeFile("s.yaml", setDoc("s", refs...))
	if running := g.waitRunning(t, 1); running[0] != refs[0] {
		t.Fatalf("first pull %v, want the set's first image %s", running, refs[0])
	}
	g.end(refs[0], nil)
	if running := g.waitRunning(t, 9); slices.Contains(running, refs[0]) {
		t.Fatalf("running %v", running)
	}
	g.endAll(refs)
	h.waitFor("Ready", phase("s", status.Ready))
	if started, _, _ := g.snapshot(); len(started) != 10 {
		t.Fatalf("pulls %v, want one each", started)
	}
}

// The first pull of a shared layer fails: the next image takes the layer (alone), and
// the rest follow once it is held; the failed image is pulled again later.
func TestSharedLayerFailureLetsTheNextGo(t *testing.T) {
	refs, layers := sharedBase("app", 10)
	h, g := orderedHarness(t, layers, refs...)
	h.start()
	h.writeFile("s.yaml", setDoc("s", refs...))
	g.waitRunning(t, 1)
	g.end(refs[0], &cri.PullError{Message: "reading blob sha256:base: received unexpected HTTP status: 503 Service Unavailable"})
	running := g.waitRunning(t, 1)
	if running[0] == refs[0] {
		t.Fatalf("the failed image took the layer again at once: %v", running)
	}
	if running[0] != refs[1] {
		t.Fatalf("after the failure %v took the layer, want the next in the set, %s", running, refs[1])
	}
	g.end(refs[1], nil)
	g.endAll(refs)
	h.waitFor("Ready", phase("s", status.Ready))
	started, _, _ := g.snapshot()
	if started[0] != refs[0] || started[1] != refs[1] || len(started) != 11 {
		t.Fatalf("pulls in order %v: want %s, %s, then the rest and %s again", started, refs[0], refs[1], refs[0])
	}
}

// Images with disjoint layers, and images whose layers are not known, pull in parallel.
func TestDisjointLayersPullInParallel(t *testing.T) {
	var refs []string
	layers := map[string][]string{}
	for i := range 6 {
		ref := img(fmt.Sprintf("d%d", i), i)
		refs = append(refs, ref)
		if i < 4 {
			layers[ref] = []string{fmt.Sprintf("sha256:d%d-base", i), fmt.Sprintf("sha256:d%d-app", i)}
		}
	}
	// Two unsized images share nothing known: they are never held back.
	h, g := orderedHarness(t, layers, refs...)
	h.start()
	h.writeFile("s.yaml", setDoc("s", refs...))
	g.waitRunning(t, 6)
	g.endAll(refs)
	h.waitFor("Ready", phase("s", status.Ready))
}

// A layer held (an image holding it was pulled) never holds a pull back: a second set on
// the same base pulls all its images at once.
func TestHeldLayerNeverBlocks(t *testing.T) {
	first, layers := sharedBase("one", 1)
	second, more := sharedBase("two", 5)
	for k, v := range more {
		layers[k] = v
	}
	h, g := orderedHarness(t, layers, append(first, second...)...)
	g.endAll(first)
	h.start()
	h.writeFile("a.yaml", setDoc("a", first...))
	h.waitFor("a Ready", phase("a", status.Ready))
	h.writeFile("b.yaml", setDoc("b", second...))
	g.waitRunning(t, 5)
	g.endAll(second)
	h.waitFor("b Ready", phase("b", status.Ready))
}

// Without the order (containerd, or through the node-local mirror), images sharing a
// layer pull at once.
func TestNoOrderPullsSharedLayersAtOnce(t *testing.T) {
	refs, layers := sharedBase("app", 5)
	h, g := orderedHarness(t, layers, refs...)
	h.cfg.OrderByLayers = false
	h.start()
	h.writeFile("s.yaml", setDoc("s", refs...))
	g.waitRunning(t, 5)
	g.endAll(refs)
	h.waitFor("Ready", phase("s", status.Ready))
}

// The order's state stays bounded by the wanted images: the layers of an image no
// longer wanted, or gone from the runtime, are no longer counted as held; a pull's
// claims end with it, and a freed layer sends the scan back to its first waiter.
func TestLayerStateBounded(t *testing.T) {
	a := New(Config{}, Deps{})
	a.pulls.images = map[string]*imageState{}
	p := &a.pulls
	x, y, z := &imageState{inflight: true}, &imageState{}, &imageState{}
	p.images["x"], p.images["y"] = x, y
	p.claim(x, "x", []string{"base", "x1"})
	if b := p.blockedBy([]string{"y1", "base"}); b == nil || b.image != "x" {
		t.Fatalf("base fetched by x: blocked by %+v", b)
	}
	p.blockedBy([]string{"base"}).wait(7)
	p.blockedBy([]string{"base"}).wait(9)
	p.dispatchFrom = 20
	p.release(x, true)
	if p.dispatchFrom != 7 || len(p.fetching) != 0 || p.held["base"] != 1 || p.held["x1"] != 1 {
		t.Fatalf("after x's pull: from %d, fetching %v, held %v", p.dispatchFrom, p.fetching, p.held)
	}
	if b := p.blockedBy([]string{"base", "y1"}); b != nil {
		t.Fatalf("a held layer blocks: %+v", b)
	}
	p.claim(y, "y", []string{"base", "y1"})
	if !slices.Equal(y.claimed, []string{"y1"}) {
		t.Fatalf("y claimed %v: the held base needs no fetch", y.claimed)
	}
	p.release(y, false)
	if len(p.fetching) != 0 || p.held["y1"] != 0 {
		t.Fatalf("after y failed: fetching %v, held %v", p.fetching, p.held)
	}
	p.claim(z, "z", []string{"z1"})
	p.release(z, true)
	p.images["z"] = z
	x.inflight = false
	// Neither x nor z is wanted any longer.
	a.refreshPresence(context.Background(), nil)
	if len(p.images) != 0 || len(p.held) != 0 {
		t.Fatalf("images %v, held %v: state of images no longer wanted", p.images, p.held)
	}
}
