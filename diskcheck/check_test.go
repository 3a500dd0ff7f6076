package diskcheck

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/imagepin/imagepin/internal/bytesize"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/registrytest"
)

func TestAdmissionCountsSharedLayersOnceAndRefusesInOrder(t *testing.T) {
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	base := layer(t, 10000)
	u1, u2, u3, u5 := layer(t, 3000), layer(t, 4000), layer(t, 5000), layer(t, 30000)
	img1 := reg.Host + "/" + reg.Push("a/one", image(t, base, u1), "")
	img2 := reg.Host + "/" + reg.Push("a/two", image(t, base, u2), "")
	img3 := reg.Host + "/" + reg.Push("b/three", image(t, base, u3), "")
	img4 := reg.Host + "/" + reg.Push("c/four", image(t, u5), "")
	missing := reg.Host + "/a/none@sha256:" + strings.Repeat("0", 64)
	down := "127.0.0.1:1/x/y@sha256:" + strings.Repeat("1", 64) // nothing listens on port 1
	sets := []SetRequest{
		{Name: "a", Missing: []string{img1, img2, missing}},
		{Name: "b", Missing: []string{img3, down}},
		{Name: "c", Missing: []string{img4}},
	}
	needA := 2 * layerBytes(t, base, u1, u2)
	needB := 2 * layerBytes(t, u3) // base already counted for a
	needC := 2 * layerBytes(t, u5)

	check := func(space Space, threshold int) Result {
		t.Helper()
		c := New(Config{NodeName: "n1", Multiplier: 2, GCHighThresholdPercent: threshold},
			resolver(f, registry.Platform{}, nil), func(context.Context) (string, error) { return "/var/lib/containers/storage", nil })
		c.statfs = func(string) (Space, error) { return space, nil }
		res, err := c.Check(context.Background(), sets, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}

	// Plenty of space: all admitted; shared base counted once.
	res := check(Space{Capacity: 1 << 30, Available: 1 << 29}, 85)
	for _, name := range []string{"a", "b", "c"} {
		if !res.Verdicts[name].Admitted {
			t.Fatalf("%s not admitted: %+v", name, res.Verdicts[name].Condition)
		}
	}
	a, b := res.Verdicts["a"], res.Verdicts["b"]
	if a.Bytes[img1] != layerBytes(t, base, u1) || a.Bytes[img2] != layerBytes(t, base, u2) {
		t.Fatalf("per-image bytes %v", a.Bytes)
	}
	if _, ok := a.Unavailable[missing]; !ok || !strings.Contains(a.Unavailable[missing], "name unknown") {
		t.Fatalf("unavailable %v", a.Unavailable)
	}
	if _, ok := b.Unsized[down]; !ok || a.Condition.Status != status.True || b.Condition.Status != status.Unknown {
		t.Fatalf("unsized %v; conditions %+v / %+v", b.Unsized, a.Condition, b.Condition)
	}
	if res.Filesystem.Path != "/var/lib/containers/storage" || res.Filesystem.FreeBytes != 1<<29 {
		t.Fatalf("filesystem %+v", res.Filesystem)
	}

	// The GC threshold refuses c: used 50000 + a + b + c crosses 70% of the capacity.
	capacity := uint64(50000) + needA + needB + needC
	capacity = capacity * 100 / 75
	res = check(Space{Capacity: capacity, Available: capacity - 50000}, 70)
	if !res.Verdicts["a"].Admitted || !res.Verdicts["b"].Admitted || res.Verdicts["c"].Admitted {
		t.Fatalf("threshold: %+v", res.Verdicts)
	}
	c := res.Verdicts["c"].Condition
	if c.Reason != status.ReasonInsufficientDiskSpace || c.Status != status.False ||
		!strings.Contains(c.Message, "node n1: 1 images need ") || !strings.Contains(c.Message, "(2 × ") ||
		!strings.Contains(c.Message, "on /var/lib/containers/storage") || !strings.Contains(c.Message, "image GC starts at 70%") ||
		!strings.Contains(c.Message, "after ") {
		t.Fatalf("message %q", c.Message)
	}

	// Free space refuses b (a fits alone); c alone would fit, but a came first.
	avail := needA + needB/2
	res = check(Space{Capacity: 2 * avail, Available: avail}, 100)
	if !res.Verdicts["a"].Admitted || res.Verdicts["b"].Admitted {
		t.Fatalf("free space: %+v", res.Verdicts)
	}
	if res.Verdicts["c"].Admitted != (needA+needC <= avail) {
		t.Fatalf("c admitted=%v", res.Verdicts["c"].Admitted)
	}
}

// A disk past the kubelet's GC threshold, and full: a set whose images are all present
// (nothing missing), or whose missing layers a set before it already counts, needs 0
// bytes and is admitted; one that needs more is refused.
func TestZeroNeedIsNeverRefused(t *testing.T) {
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	shared := layer(t, 20000)
	one := reg.Host + "/" + reg.Push("a/one", image(t, shared), "")
	c := New(Config{NodeName: "n1", Multiplier: 2, GCHighThresholdPercent: 85},
		resolver(f, registry.Platform{}, nil), func(context.Context) (string, error) { return "/var/lib/containers/storage", nil })
	c.statfs = func(string) (Space, error) { return Space{Capacity: 1 << 30, Available: 1 << 20}, nil } // 99.9% used
	res, err := c.Check(context.Background(), []SetRequest{
		{Name: "needs-space", Missing: []string{one}},
		{Name: "present", Missing: nil},
		{Name: "same-layers", Missing: []string{one}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v := res.Verdicts["needs-space"]; v.Admitted || v.Condition.Reason != status.ReasonInsufficientDiskSpace {
		t.Fatalf("needs-space: %+v", v)
	}
	if v := res.Verdicts["present"]; !v.Admitted || v.Condition.Status != status.True {
		t.Fatalf("a set with every image present was refused: %+v", v.Condition)
	}
	// "same-layers" needs the layer "needs-space" would have brought: not counted, since
	// that set was refused, so it is refused too.
	if v := res.Verdicts["same-layers"]; v.Admitted {
		t.Fatalf("same-layers: %+v", v)
	}
}

func TestGCHighThreshold(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubelet.conf")
	if v, _, err := GCHighThreshold(0, kc, ""); v != 85 || err != nil {
		t.Fatalf("absent: %d %v", v, err)
	}
	os.WriteFile(kc, []byte("kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\nimageGCHighThresholdPercent: 70\n"), 0o644)
	if v, from, err := GCHighThreshold(0, kc, ""); v != 70 || from != kc || err != nil {
		t.Fatalf("from kubelet: %d %s %v", v, from, err)
	}
	if v, _, _ := GCHighThreshold(90, kc, ""); v != 90 {
		t.Fatalf("configured wins: %d", v)
	}
	// The kubelet's drop-in directory (--config-dir) overrides its file, as in the kubelet.
	dropIns := filepath.Join(dir, "kubelet.conf.d")
	os.MkdirAll(dropIns, 0o755)
	os.WriteFile(filepath.Join(dropIns, "50-gc.conf"), []byte("kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\nimageGCHighThresholdPercent: 75\n"), 0o644)
	if v, from, err := GCHighThreshold(0, kc, dropIns); v != 75 || !strings.Contains(from, "50-gc.conf") || err != nil {
		t.Fatalf("from the drop-in: %d %s %v", v, from, err)
	}
	os.WriteFile(kc, []byte(`{"imageGCHighThresholdPercent": 0}`), 0o644)
	if v, _, err := GCHighThreshold(0, kc, ""); v != 85 || err == nil {
		t.Fatalf("out of range: %d %v", v, err)
	}
}

func TestHuman(t *testing.T) {
	for b, want := range map[uint64]string{512: "512 B", 1536: "1.5 KiB", 14_2 * (1 << 30) / 10: "14.2 GiB", 120 << 30: "120.0 GiB"} {
		if got := bytesize.Human(b); got != want {
			t.Errorf("bytesize.Human(%d) = %q, want %q", b, got, want)
		}
	}
}

// The image filesystem is asked once per maxAge; a failure with an answer at hand keeps it.
func TestCachedImageFS(t *testing.T) {
	now := time.Unix(0, 0)
	calls := 0
	fail := false
	f := CachedImageFS(func(context.Context) (string, error) {
		calls++
		if fail {
			return "", errors.New("get disk usage: lstat .tmp-images.json: no such file or directory")
		}
		return "/var/lib/containers/storage/overlay-images", nil
	}, time.Minute, func() time.Time { return now })
	for i := 0; i < 5; i++ {
		if p, err := f(context.Background()); err != nil || p == "" {
			t.Fatal(p, err)
		}
	}
	if calls != 1 {
		t.Fatalf("%d calls within maxAge", calls)
	}
	now = now.Add(2 * time.Minute)
	fail = true
	if p, err := f(context.Background()); err != nil || p != "/var/lib/containers/storage/overlay-images" {
		t.Fatalf("a failure in passing: %q %v", p, err)
	}
	if calls != 2 {
		t.Fatalf("%d calls", calls)
	}
}

// With the node-local mirror's store ([peers]), each layer's compressed blob is kept once
// more: the need grows by the compressed bytes, shared layers still counted once.
func TestKeepsCompressedAddsTheCompressedBytes(t *testing.T) {
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	base, u1, u2 := layer(t, 10000), layer(t, 3000), layer(t, 4000)
	img1 := reg.Host + "/" + reg.Push("a/one", image(t, base, u1), "")
	img2 := reg.Host + "/" + reg.Push("a/two", image(t, base, u2), "")
	need := func(keep bool) string {
		c := New(Config{NodeName: "n1", Multiplier: 2, GCHighThresholdPercent: 85, KeepsCompressed: keep},
			resolver(f, registry.Platform{}, nil), func(context.Context) (string, error) { return "/var/lib/containers/storage", nil })
		// Room for the real need, not for the most the layers could hold: the uncompressed
		// sizes are asked (TestRangeRequestsOnlyWhenTheyCanChangeTheVerdict).
		c.statfs = func(string) (Space, error) { return Space{Capacity: 8 << 20, Available: 4 << 20}, nil }
		res, err := c.Check(context.Background(), []SetRequest{{Name: "a", Missing: []string{img1, img2}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res.Verdicts["a"].Condition.Message
	}
	compressed := layerBytes(t, base, u1, u2)
	without, with := need(false), need(true)
	// need = max(2 × compressed, uncompressed + compressed) over the three layers, once
	// each; with the store, + the compressed bytes.
	var n uint64
	for _, l := range []v1.Layer{base, u1, u2} {
		size, _ := l.Size()
		n += max(2*uint64(size), layerBytes(t, l)+uncompressedSize(t, l))
	}
	if !strings.Contains(without, "need "+bytesize.Human(n)+" (") || !strings.Contains(with, "need "+bytesize.Human(n+compressed)+" (") ||
		!strings.Contains(with, "+ "+bytesize.Human(compressed)+" compressed for the node-local mirror's store") {
		t.Fatalf("need without the store %q, with it %q; compressed layers %d", without, with, compressed)
	}
}

func uncompressedSize(t *testing.T, l v1.Layer) uint64 {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	n, err := io.Copy(io.Discard, rc)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(n)
}

// A node joining with the registry gone cannot size an image before its pin is written
// (the node-local mirror serves pinned images only). With [peers] the message, which the
// agent logs as it is, says what the later check waits for, and that the error shown is
// the registry's, not why the image will fail; without [peers] it says neither.
func TestUnsizedImagesSayWhatTheyWaitFor(t *testing.T) {
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	sized := reg.Host + "/" + reg.Push("a/one", image(t, layer(t, 3000)), "")
	gone := "127.0.0.1:1/x/y@sha256:" + strings.Repeat("1", 64) // nothing listens on port 1
	message := func(throughMirror bool) status.Condition {
		t.Helper()
		c := New(Config{NodeName: "n1", Multiplier: 2, GCHighThresholdPercent: 85, ThroughMirror: throughMirror},
			resolver(f, registry.Platform{}, nil), func(context.Context) (string, error) { return "/var/lib/containers/storage", nil })
		c.statfs = func(string) (Space, error) { return Space{Capacity: 1 << 30, Available: 1 << 29}, nil }
		res, err := c.Check(context.Background(), []SetRequest{{Name: "a", Missing: []string{sized, gone}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res.Verdicts["a"].Condition
	}
	const waits = "1 more could not be sized yet and wait for a later check (right after its pin is written, through the node-local mirror: the node's store and its peers; the error below is its registry's): "
	with := message(true)
	if with.Status != status.Unknown || with.Reason != status.ReasonCheckingDisk || !strings.Contains(with.Message, waits) ||
		!strings.Contains(with.Message[strings.Index(with.Message, waits)+len(waits):], "127.0.0.1:1") {
		t.Fatalf("with [peers]: %+v\nwant the message to say %q, then the registry's error", with, waits)
	}
	without := message(false)
	if without.Status != status.Unknown || !strings.Contains(without.Message, "1 more could not be sized yet and wait for a later check: ") ||
		strings.Contains(without.Message, "node-local mirror") {
		t.Fatalf("without [peers]: %+v", without)
	}
}
