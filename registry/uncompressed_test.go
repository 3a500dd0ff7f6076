package registry

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"
	ctypes "go.podman.io/image/v5/types"

	"github.com/imagepin/imagepin/test/registrytest"
)

// textTar is a tar of compressible text (about 5:1 with gzip).
func textTar(t *testing.T, n int) []byte {
	var text bytes.Buffer
	for i := 0; text.Len() < n; i++ {
		fmt.Fprintf(&text, "usr/lib/openshift/component-%d/bin/operator --config /etc/kube/%d.yaml\n", i%97, i%13)
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "data.txt", Mode: 0o644, Size: int64(text.Len())})
	tw.Write(text.Bytes())
	tw.Close()
	return b.Bytes()
}

func gzipped(t *testing.T, data ...[]byte) []byte {
	var b bytes.Buffer
	for _, d := range data { // one member each
		zw := gzip.NewWriter(&b)
		zw.Write(d)
		zw.Close()
	}
	return b.Bytes()
}

// Each layer's uncompressed size is learned from the blob by one Range request through
// containers/image (gzip trailer, zstd frame header), or known (a plain tar); what does
// not look right is unknown and the multiplier decides.
func TestUncompressedSizesByRange(t *testing.T) {
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	tarA, tarB, tarC, tarD, tarE := textTar(t, 400<<10), textTar(t, 300<<10), textTar(t, 200<<10), textTar(t, 100<<10), textTar(t, 50<<10)
	enc, _ := zstd.NewWriter(nil)
	withFCS := enc.EncodeAll(tarB, nil) // records the content size
	var stream bytes.Buffer
	sw, _ := zstd.NewWriter(&stream) // streaming: no content size
	sw.Write(tarC)
	sw.Close()
	multi := gzipped(t, tarD, []byte("x")) // two members: the trailer is the last one's
	layers := []struct {
		name, mediaType string
		blob            []byte
		want            int64
		from            string
	}{
		{"gzip", string(types.OCILayer), gzipped(t, tarA), int64(len(tarA)), FromGzipTrailer},
		{"zstd with content size", string(types.OCILayerZStd), withFCS, int64(len(tarB)), FromZstdHeader},
		{"zstd streamed", string(types.OCILayerZStd), stream.Bytes(), 0, ""},
		{"gzip, two members", string(types.OCILayer), multi, 0, ""},
		{"plain tar", string(types.OCIUncompressedLayer), tarE, int64(len(tarE)), FromTar},
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	for _, l := range layers {
		var err error
		if img, err = mutate.AppendLayers(img, static.NewLayer(l.blob, types.MediaType(l.mediaType))); err != nil {
			t.Fatal(err)
		}
	}
	ref := reg.Host + "/" + reg.Push("u/layers", img, "")
	r := resolver(f, Platform{}, nil)
	// Layers asks no Range: each compressed layer says the most its request could
	// report, a plain tar its own size.
	first, err := r.Layers(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	if n := r.RangeRequests(); n != 0 {
		t.Errorf("Layers made %d Range requests", n)
	}
	for i, l := range layers {
		g, bound := first.Layers[i], int64(0)
		switch l.mediaType {
		case string(types.OCILayer):
			bound = min(1032*g.Size, 1<<32-1)
		case string(types.OCILayerZStd):
			bound = 32768 * g.Size
		}
		if g.MaxUncompressed != bound || (l.from == FromTar) != (g.Uncompressed == l.want && g.From == FromTar) {
			t.Errorf("%s from Layers: %+v, want the most %d", l.name, g, bound)
		}
	}
	got, err := r.Resolve(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	for i := range layers {
		if got.Layers[i].MaxUncompressed != 0 {
			t.Errorf("%s: sized, yet the most %d", layers[i].name, got.Layers[i].MaxUncompressed)
		}
	}
	for i, l := range layers {
		g := got.Layers[i]
		if g.Uncompressed != l.want || g.From != l.from {
			t.Errorf("%s: uncompressed %d from %q, want %d from %q", l.name, g.Uncompressed, g.From, l.want, l.from)
		}
	}
	if n := r.RangeRequests(); n != 4 {
		t.Errorf("%d Range requests, want 4 (one per compressed layer)", n)
	}
	if gz := got.Layers[0]; gz.Uncompressed <= gz.Size {
		t.Errorf("gzip text layer: %d uncompressed for %d compressed", gz.Uncompressed, gz.Size)
	}
	// Layers are immutable: a second image with the same layers costs no Range request.
	img2, _ := mutate.AppendLayers(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON),
		static.NewLayer(layers[0].blob, types.OCILayer))
	ref2 := reg.Host + "/" + reg.Push("u/again", img2, "")
	if _, err := r.Resolve(context.Background(), ref2); err != nil || r.RangeRequests() != 4 {
		t.Fatalf("second image: %v, %d Range requests", err, r.RangeRequests())
	}
	// The Range path is containers/image's, through the mirror that served the manifest.
	if !strings.Contains(ref, reg.Host) {
		t.Fatal(ref)
	}
}

func TestZstdContentSize(t *testing.T) {
	for _, c := range []struct {
		hdr  []byte
		want int64
		ok   bool
	}{
		{[]byte{0x28, 0xb5, 0x2f, 0xfd, 0x20, 200}, 200, true},                              // single segment, 1-byte size
		{[]byte{0x28, 0xb5, 0x2f, 0xfd, 0x40, 0x00, 0x10, 0x00}, 16 + 256, true},            // 2-byte size (+256), window byte
		{[]byte{0x28, 0xb5, 0x2f, 0xfd, 0x80, 0x00, 0x00, 0x00, 0x10, 0x00}, 1 << 20, true}, // 4-byte size
		{[]byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x00}, 0, false},                              // no size recorded
		{[]byte{0x50, 0x2a, 0x4d, 0x18, 0, 0}, 0, false},                                    // a skippable frame
	} {
		got, ok := zstdContentSize(c.hdr)
		if got != c.want || ok != c.ok {
			t.Errorf("%x: %d %v, want %d %v", c.hdr, got, ok, c.want, c.ok)
		}
	}
}

// A hostile or broken blob header cannot make a need small: a zstd frame claiming 2^62
// bytes (or anything over MaxLayerSize) is an unknown size, so the administrator's
// multiplier decides; sums saturate instead of wrapping. Before the fix such a header
// was taken, the sums wrapped, and a set that cannot fit was "admitted" for 4 MiB.
func TestImplausibleSizesDoNotWrap(t *testing.T) {
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	ref := reg.Host + "/" + reg.Push("u/hostile", registrytest.ForgedZstdImage(t), "")
	got, err := resolver(f, Platform{}, nil).Resolve(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range got.Layers {
		if l.Uncompressed != 0 {
			t.Fatalf("a 2^62-byte claim was taken: uncompressed %d", l.Uncompressed)
		}
	}
	// A gzip trailer is the size modulo 2^32: for a blob of 4 GiB or more it says nothing.
	if n, from, reqs := uncompressedSize(context.Background(), nil, ctypes.BlobInfo{Size: 5 << 30, MediaType: string(types.OCILayer)}); n != 0 || from != "" || reqs != 0 {
		t.Fatalf("a 5 GiB gzip blob's trailer was read: %d %q", n, from)
	}
}

// Sums of sizes saturate at the largest uint64 instead of wrapping to a small need.
func TestSizeSumsSaturate(t *testing.T) {
	if AddSat(math.MaxUint64-1, 2) != math.MaxUint64 || AddSat(1, 2) != 3 {
		t.Fatal("AddSat")
	}
	if n := (Image{Layers: []Layer{{Size: math.MaxInt64}, {Size: math.MaxInt64}, {Size: 2}}}).Bytes(); n != math.MaxUint64 {
		t.Fatalf("bytes %d", n)
	}
}
