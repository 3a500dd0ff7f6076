package diskcheck

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/test/registrytest"
)

// textLayer is a gzip layer of text, which compresses far better than 2:1.
func textLayer(t *testing.T, n int) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	body := []byte(strings.Repeat("imagepin sizes layers before it pulls them; ", n/44+1)[:n])
	tw.WriteHeader(&tar.Header{Name: "log.txt", Mode: 0o644, Size: int64(len(body))})
	tw.Write(body)
	tw.Close()
	raw := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// The Range requests are made only when their answer can change a verdict: with room for
// the most the layers' formats can hold, and with less room than the floor, the
// manifests decide alone; in between the layers are sized and the verdict is exact.
func TestRangeRequestsOnlyWhenTheyCanChangeTheVerdict(t *testing.T) {
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	l := textLayer(t, 256<<10)
	ref := reg.Host + "/" + reg.Push("text/one", image(t, l), "")
	c := layerBytes(t, l)
	u := uncompressedSize(t, l)
	if u < 10*c {
		t.Fatalf("the text layer compresses %d to %d only", u, c)
	}
	var requests int64 // the registry's, in the last check
	check := func(avail uint64) (Verdict, int64) {
		t.Helper()
		before := reg.Requests()
		defer func() { requests = reg.Requests() - before }()
		res := resolver(f, registry.Platform{}, nil)
		chk := New(Config{NodeName: "n1", Multiplier: 2, GCHighThresholdPercent: 100}, res,
			func(context.Context) (string, error) { return "/var/lib/containers/storage", nil })
		chk.statfs = func(string) (Space, error) { return Space{Capacity: 2 * avail, Available: avail}, nil }
		out, err := chk.Check(context.Background(), []SetRequest{{Name: "s", Missing: []string{ref}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return out.Verdicts["s"], res.RangeRequests()
	}
	// Room for 1032 × compressed: admitted, nothing asked.
	if v, n := check(1 << 40); !v.Admitted || n != 0 || !strings.Contains(v.Condition.Message, "uncompressed sizes not asked") {
		t.Fatalf("plenty of room: admitted=%v, %d Range requests, %q", v.Admitted, n, v.Condition.Message)
	}
	manifestsOnly := requests
	// Less than the floor: refused, nothing asked.
	if v, n := check(2*c - 1); v.Admitted || n != 0 {
		t.Fatalf("below the floor: admitted=%v, %d Range requests, %q", v.Admitted, n, v.Condition.Message)
	}
	// Room for uncompressed + compressed but not for the most: asked, admitted.
	if v, n := check(u + c); !v.Admitted || n != 1 || strings.Contains(v.Condition.Message, "not asked") {
		t.Fatalf("room for the real need: admitted=%v, %d Range requests, %q", v.Admitted, n, v.Condition.Message)
	}
	// The layer was sized on the source that read the manifest: the Range request is the
	// one request more (no second ping or manifest).
	if requests != manifestsOnly+1 {
		t.Fatalf("%d registry requests, %d without the Range request", requests, manifestsOnly)
	}
	// Room for the floor, not for the real need: asked, refused (the floor alone would
	// have admitted it).
	if v, n := check(u + c - 1); v.Admitted || n != 1 {
		t.Fatalf("room for the floor only: admitted=%v, %d Range requests, %q", v.Admitted, n, v.Condition.Message)
	}
}

// When the verdict depends on the sizes, the layers with the most at stake are sized
// first, only as many as the decision needs: here the large layer's size decides, and
// the small one is not asked.
func TestTheLayersOfMostStakeAreSizedFirst(t *testing.T) {
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	large, small := layer(t, 64<<10), layer(t, 1<<10)
	refLarge := reg.Host + "/" + reg.Push("stake/large", image(t, large), "")
	refSmall := reg.Host + "/" + reg.Push("stake/small", image(t, small), "")
	cl, cs := layerBytes(t, large), layerBytes(t, small)
	needLarge := max(2*cl, cl+uncompressedSize(t, large))
	room := needLarge + 1033*cs // the large one's real need, the small one's most
	res := resolver(f, registry.Platform{}, nil)
	chk := New(Config{NodeName: "n1", Multiplier: 2, GCHighThresholdPercent: 100}, res,
		func(context.Context) (string, error) { return "/var/lib/containers/storage", nil })
	chk.statfs = func(string) (Space, error) { return Space{Capacity: 2 * room, Available: room}, nil }
	out, err := chk.Check(context.Background(), []SetRequest{{Name: "s", Missing: []string{refSmall, refLarge}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v := out.Verdicts["s"]; !v.Admitted || res.RangeRequests() != 1 || !strings.Contains(v.Condition.Message, "not asked") {
		t.Fatalf("admitted=%v after %d Range requests: %q", v.Admitted, res.RangeRequests(), v.Condition.Message)
	}
	// One byte less: the small layer is asked too, and the set fits on its real need.
	res = resolver(f, registry.Platform{}, nil)
	chk = New(Config{NodeName: "n1", Multiplier: 2, GCHighThresholdPercent: 100}, res,
		func(context.Context) (string, error) { return "/var/lib/containers/storage", nil })
	chk.statfs = func(string) (Space, error) { return Space{Capacity: 2 * room, Available: room - 1}, nil }
	out, err = chk.Check(context.Background(), []SetRequest{{Name: "s", Missing: []string{refSmall, refLarge}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v := out.Verdicts["s"]; !v.Admitted || res.RangeRequests() != 2 || strings.Contains(v.Condition.Message, "not asked") {
		t.Fatalf("one byte less: admitted=%v after %d Range requests: %q", v.Admitted, res.RangeRequests(), v.Condition.Message)
	}
}
