package diskcheck

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/internal/bytesize"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/test/registrytest"
)

// putLayer writes l's compressed blob into store.
func putLayer(t *testing.T, store *blobstore.Store, l v1.Layer) {
	t.Helper()
	ctx := context.Background()
	ld, _ := l.Digest()
	rc, err := l.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, _ := io.ReadAll(rc)
	w, err := store.Writer(ctx, digest.Digest(ld.String()), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Write(b)
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// With the node-local mirror's store (CRI-O, [peers]), the store keeps every blob of
// what the node pins, also of images the runtime holds already (the kubelet pulled
// them): the check counts the compressed layers the store lacks of those too, once
// each, and not what it holds. A set whose images are all present is still admitted on
// a full disk (refusing it frees nothing), and what the store will keep of it counts
// against the sets after it.
func TestTheStoresGrowthCountsThePresentImages(t *testing.T) {
	reg := registryFor(t)
	base, u1, u2, u3, u4 := layer(t, 20000), layer(t, 3000), layer(t, 4000), layer(t, 5000), layer(t, 6000)
	v1ref := reg.push("app/v1", base, u1) // running: present
	v2ref := reg.push("app/v2", base, u2) // the next release: missing
	other := reg.push("other/x", u3, u4)  // present, u4 in the store already
	later := reg.push("later/y", layer(t, 7000))
	store, err := blobstore.Open(filepath.Join(t.TempDir(), "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	putLayer(t, store, u4)
	sets := []SetRequest{
		{Name: "a-runs", Present: []string{v1ref, other}},
		{Name: "b-next", Missing: []string{v2ref}, Present: []string{v1ref}},
		{Name: "c-later", Missing: []string{later}},
	}
	check := func(space Space) Result {
		t.Helper()
		c := New(Config{NodeName: "n1", Multiplier: 2, GCHighThresholdPercent: 100, KeepsCompressed: true, Store: store},
			resolver(reg.files, registry.Platform{}, nil), func(context.Context) (string, error) { return "/var/lib/containers/storage", nil })
		c.statfs = func(string) (Space, error) { return space, nil }
		res, err := c.Check(context.Background(), sets, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := check(Space{Capacity: 1 << 40, Available: 1 << 39})
	a, b := res.Verdicts["a-runs"], res.Verdicts["b-next"]
	forA := layerBytes(t, base, u1, u3)
	if a.ForStore != forA || a.Need != forA || !strings.Contains(a.Condition.Message, "+ "+bytesize.Human(forA)+" compressed for the node-local mirror's store") ||
		!strings.Contains(a.Condition.Message, bytesize.Human(layerBytes(t, u4))+" of the layers in the node's store already") {
		t.Fatalf("a set of present images: for the store %d, need %d, want %d: %q", a.ForStore, a.Need, forA, a.Condition.Message)
	}
	// b: base and v1's layers were counted for a; u2 is pulled and kept.
	if b.ForStore != layerBytes(t, u2) || b.Need < 2*layerBytes(t, u2)+layerBytes(t, u2) {
		t.Fatalf("the next release: for the store %d, need %d: %q", b.ForStore, b.Need, b.Condition.Message)
	}

	// A full disk: a is admitted whatever (its images stay pinned and the store keeps
	// them), and its growth leaves no room for c, which would fit alone.
	cNeed := res.Verdicts["c-later"].Need
	res = check(Space{Capacity: 1 << 40, Available: forA + b.Need + cNeed - 1})
	if !res.Verdicts["a-runs"].Admitted || !res.Verdicts["b-next"].Admitted || res.Verdicts["c-later"].Admitted {
		t.Fatalf("short of the store's growth: %+v", res.Verdicts)
	}
	res = check(Space{Capacity: 1 << 40, Available: 1})
	if !res.Verdicts["a-runs"].Admitted || res.Verdicts["b-next"].Admitted {
		t.Fatalf("a full disk: %+v", res.Verdicts)
	}
}

// Without the store (containerd keeps its compressed blobs; [peers] off), present
// images cost nothing and are not even sized.
func TestPresentImagesCostNothingWithoutTheStore(t *testing.T) {
	reg := registryFor(t)
	v1ref := reg.push("app/v1", layer(t, 20000))
	before := reg.Requests()
	c := New(Config{NodeName: "n1", Multiplier: 2, GCHighThresholdPercent: 100},
		resolver(reg.files, registry.Platform{}, nil), func(context.Context) (string, error) { return "/var/lib/containers/storage", nil })
	c.statfs = func(string) (Space, error) { return Space{Capacity: 1 << 30, Available: 1 << 29}, nil }
	res, err := c.Check(context.Background(), []SetRequest{{Name: "a", Present: []string{v1ref}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v := res.Verdicts["a"]; !v.Admitted || v.Need != 0 || reg.Requests() != before {
		t.Fatalf("need %d, %d registry requests: %+v", v.Need, reg.Requests()-before, v.Condition)
	}
}

// Sizes not asked (room for the most the layers can hold): the need is a range, from
// the floor to that most, in the verdict and its message, not the floor alone.
func TestANeedNotAskedIsARange(t *testing.T) {
	reg := registryFor(t)
	l := textLayer(t, 256<<10)
	ref := reg.push("text/one", l)
	c := New(Config{NodeName: "n1", Multiplier: 2, GCHighThresholdPercent: 100},
		resolver(reg.files, registry.Platform{}, nil), func(context.Context) (string, error) { return "/var/lib/containers/storage", nil })
	c.statfs = func(string) (Space, error) { return Space{Capacity: 1 << 41, Available: 1 << 40}, nil }
	res, err := c.Check(context.Background(), []SetRequest{{Name: "s", Missing: []string{ref}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	v := res.Verdicts["s"]
	floor := 2 * layerBytes(t, l)
	if v.Need != floor || v.NeedMost <= uncompressedSize(t, l) {
		t.Fatalf("need %d to %d; want %d to at least the real %d", v.Need, v.NeedMost, floor, uncompressedSize(t, l))
	}
	if want := "1 images need " + bytesize.Human(floor) + " to " + bytesize.Human(v.NeedMost) + " ("; !strings.Contains(v.Condition.Message, want) ||
		!strings.Contains(v.Condition.Message, "uncompressed sizes not asked") {
		t.Fatalf("message %q, want %q", v.Condition.Message, want)
	}
	// Asked (less room): exact, one figure.
	c.statfs = func(string) (Space, error) {
		return Space{Capacity: 1 << 41, Available: uncompressedSize(t, l) + layerBytes(t, l)}, nil
	}
	res, err = c.Check(context.Background(), []SetRequest{{Name: "s", Missing: []string{ref}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v := res.Verdicts["s"]; v.Need != v.NeedMost || strings.Contains(v.Condition.Message, " to ") {
		t.Fatalf("sized: need %d to %d, %q", v.Need, v.NeedMost, v.Condition.Message)
	}
}

// testRegistry is a TLS registry with the node's files trusting it.
type testRegistry struct {
	*registrytest.Registry
	files registrytest.Files
	t     *testing.T
}

func registryFor(t *testing.T) *testRegistry {
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	return &testRegistry{Registry: reg, files: f, t: t}
}

// push pushes an image of layers as repo and returns its reference by digest.
func (r *testRegistry) push(repo string, layers ...v1.Layer) string {
	return r.Host + "/" + r.Push(repo, image(r.t, layers...), "")
}
