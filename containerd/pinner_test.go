package containerd_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/imagepin/imagepin/containerd"
	"github.com/imagepin/imagepin/test/fakeruntime"
)

func ref(n int) string { return fmt.Sprintf("registry.example/app@sha256:%064x", n) }

func onNode(string) (bool, bool) { return true, false }

func pulled(t *testing.T, refs ...string) *fakeruntime.Runtime {
	t.Helper()
	rt := fakeruntime.NewContainerd()
	for _, r := range refs {
		rt.Registry[r] = nil
		if _, err := rt.PullImage(context.Background(), r, nil); err != nil {
			t.Fatal(err)
		}
	}
	return rt
}

// No label is set that the record does not hold first: a record that cannot be
// written stops the write, and nothing is labelled.
func TestRecordBeforeLabel(t *testing.T) {
	rt := pulled(t, ref(1))
	blocker := filepath.Join(t.TempDir(), "file")
	os.WriteFile(blocker, nil, 0o644)
	p := &containerd.Pinner{Images: rt, Record: filepath.Join(blocker, "labels.json")}
	if _, err := p.Write(context.Background(), []string{ref(1)}, onNode); err == nil {
		t.Fatal("a write with an unwritable record succeeded")
	}
	if rt.Labeled(ref(1)) {
		t.Fatal("labelled without a record")
	}
}

// What imagepind labelled is recorded and held across restarts; an administrator's
// label is neither recorded nor removed.
func TestRecordHeldAndOthersLabelsKept(t *testing.T) {
	ctx := context.Background()
	rt := pulled(t, ref(1), ref(2))
	rt.SetPinned(ctx, ref(2), true) // the administrator's
	record := filepath.Join(t.TempDir(), "labels.json")
	p := &containerd.Pinner{Images: rt, Record: record}
	w, err := p.Write(ctx, []string{ref(1), ref(2)}, onNode)
	if err != nil || !w.Changed {
		t.Fatalf("%+v %v", w, err)
	}
	if held := (&containerd.Pinner{Images: rt, Record: record}).Held(); !slices.Equal(held, []string{ref(1)}) {
		t.Fatalf("held after a restart: %v, want only imagepind's label", held)
	}
	if _, err := p.Write(ctx, nil, onNode); err != nil {
		t.Fatal(err)
	}
	if rt.Labeled(ref(1)) || !rt.Labeled(ref(2)) {
		t.Fatalf("after unpinning: ours %v, the administrator's %v", rt.Labeled(ref(1)), rt.Labeled(ref(2)))
	}
	if held := p.Held(); len(held) != 0 {
		t.Fatalf("held %v", held)
	}
}

// A settled node costs no call: an image known present and pinned is not asked about.
func TestSettledWriteAsksNothing(t *testing.T) {
	ctx := context.Background()
	rt := pulled(t, ref(1))
	counting := &countingImages{ImageLabels: rt}
	p := &containerd.Pinner{Images: counting, Record: filepath.Join(t.TempDir(), "labels.json")}
	if _, err := p.Write(ctx, []string{ref(1)}, onNode); err != nil {
		t.Fatal(err)
	}
	counting.calls = 0
	w, err := p.Write(ctx, []string{ref(1)}, func(string) (bool, bool) { return true, true })
	if err != nil || w.Changed || counting.calls != 0 {
		t.Fatalf("%+v %v, %d calls", w, err, counting.calls)
	}
}

type countingImages struct {
	containerd.ImageLabels
	calls int
}

func (c *countingImages) Labels(ctx context.Context, name string) (map[string]string, error) {
	c.calls++
	return c.ImageLabels.Labels(ctx, name)
}

func TestSupportOf(t *testing.T) {
	for v, ok := range map[string]bool{"v2.2.9": true, "1.7.24": true, "v1.6.20": false, "2.0.0-rc.1": true} {
		s, err := containerd.SupportOf(v)
		if err != nil || (s.Problem == "") != ok || s.PinnedField != ok {
			t.Errorf("%s: %+v %v", v, s, err)
		}
	}
}

// Pulls that return together share the record's writes (one write is two fsyncs), and
// still no label is set before the record on disk holds its reference. A write that
// fails fails every pull it would have recorded, and labels none of them.
func TestPullsReturningTogetherShareRecordWrites(t *testing.T) {
	ctx := context.Background()
	const n = 32
	var refs []string
	for i := 0; i < n; i++ {
		refs = append(refs, ref(i))
	}
	for _, broken := range []bool{false, true} {
		rt := pulled(t, refs...)
		record := filepath.Join(t.TempDir(), "labels.json")
		if broken {
			blocker := filepath.Join(t.TempDir(), "file")
			os.WriteFile(blocker, nil, 0o644)
			record = filepath.Join(blocker, "labels.json")
		}
		gate := &gatedImages{ImageLabels: rt, record: record, arrived: make(chan struct{}, n), open: make(chan struct{})}
		p := &containerd.Pinner{Images: gate, Record: record}
		if _, err := p.Write(ctx, refs, func(string) (bool, bool) { return false, false }); err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, n)
		for _, r := range refs {
			go func() {
				pinned, err := p.Pulled(ctx, r)
				if err == nil && !pinned {
					err = fmt.Errorf("%s not pinned", r)
				}
				errs <- err
			}()
		}
		for i := 0; i < n; i++ {
			<-gate.arrived
		}
		close(gate.open) // every pull returns at once
		failed := 0
		for i := 0; i < n; i++ {
			if err := <-errs; err != nil {
				if !broken {
					t.Error(err)
				}
				failed++
			}
		}
		if early, _ := gate.early.Load().(string); early != "" {
			t.Fatalf("%s labelled before the record held it", early)
		}
		if broken {
			for _, r := range refs {
				if rt.Labeled(r) {
					t.Fatalf("%s labelled with no record written", r)
				}
			}
			if failed != n {
				t.Fatalf("%d of %d pulls failed with an unwritable record", failed, n)
			}
			continue
		}
		if held := (&containerd.Pinner{Images: rt, Record: record}).Held(); len(held) != n {
			t.Fatalf("the record holds %d of %d", len(held), n)
		}
		writes := p.RecordWrites()
		t.Logf("%d pulls returning together: %d writes of the record", n, writes)
		if writes > n/2 {
			t.Fatalf("%d writes of the record for %d pulls returning together", writes, n)
		}
	}
}

// gatedImages holds every Labels call until open closes, and remembers a label set
// before the record on disk held its reference.
type gatedImages struct {
	containerd.ImageLabels
	record  string
	arrived chan struct{}
	open    chan struct{}
	early   atomic.Value // string
}

func (g *gatedImages) Labels(ctx context.Context, name string) (map[string]string, error) {
	g.arrived <- struct{}{}
	<-g.open
	return g.ImageLabels.Labels(ctx, name)
}

func (g *gatedImages) SetPinned(ctx context.Context, name string, pinned bool) error {
	if pinned && !slices.Contains((&containerd.Pinner{Record: g.record}).Held(), name) {
		g.early.Store(name)
	}
	return g.ImageLabels.SetPinned(ctx, name, pinned)
}
