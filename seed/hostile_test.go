package seed

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Bad media: each is refused with an error naming what is wrong, and nothing of it is
// stored (no blob, no ingest, no record).
func TestBadMediaStoresNothing(t *testing.T) {
	layerOf := func(t *testing.T, o *ociMedia) string {
		ls, _ := o.named.Layers()
		d, _ := ls[0].Digest()
		return filepath.Join(o.dir, "blobs", "sha256", d.Hex)
	}
	manifestOf := func(t *testing.T, o *ociMedia) string {
		d, _ := o.named.Digest()
		return filepath.Join(o.dir, "blobs", "sha256", d.Hex)
	}
	editIndex := func(t *testing.T, o *ociMedia, edit func(*ocispec.Index)) {
		raw, _ := os.ReadFile(filepath.Join(o.dir, "index.json"))
		var idx ocispec.Index
		must(t, json.Unmarshal(raw, &idx))
		edit(&idx)
		raw, _ = json.Marshal(idx)
		must(t, os.WriteFile(filepath.Join(o.dir, "index.json"), raw, 0o644))
	}
	asTar := func(t *testing.T, o *ociMedia, extra ...*tar.Header) string {
		p := filepath.Join(t.TempDir(), "media.tar")
		tarDir(t, o.dir, p, nil, extra...)
		return p
	}
	for _, tc := range []struct {
		name  string
		media func(t *testing.T, o *ociMedia) string
		want  string
	}{
		{"a truncated tar", func(t *testing.T, o *ociMedia) string {
			p := asTar(t, o)
			fi, _ := os.Stat(p)
			must(t, os.Truncate(p, fi.Size()/2))
			return p
		}, "truncated"},
		{"a layer's bytes not its digest", func(t *testing.T, o *ociMedia) string {
			p := layerOf(t, o)
			b, _ := os.ReadFile(p)
			b[len(b)/2] ^= 0xff
			must(t, os.WriteFile(p, b, 0o644))
			return o.dir
		}, "unexpected commit digest"},
		{"a manifest's bytes not its digest", func(t *testing.T, o *ociMedia) string {
			p := manifestOf(t, o)
			b, _ := os.ReadFile(p)
			i := strings.Index(string(b), "sha256:") + 7
			if b[i] == 'a' {
				b[i] = 'b'
			} else {
				b[i] = 'a'
			}
			must(t, os.WriteFile(p, b, 0o644))
			return o.dir
		}, "holds bytes of digest"},
		{"a missing blob", func(t *testing.T, o *ociMedia) string {
			must(t, os.Remove(layerOf(t, o)))
			return o.dir
		}, "is missing"},
		{"a layer shorter than its descriptor", func(t *testing.T, o *ociMedia) string {
			p := layerOf(t, o)
			b, _ := os.ReadFile(p)
			must(t, os.WriteFile(p, b[:len(b)-1], 0o644))
			return o.dir
		}, "its descriptor says"},
		{"an index naming an absent manifest", func(t *testing.T, o *ociMedia) string {
			editIndex(t, o, func(idx *ocispec.Index) {
				idx.Manifests = append(idx.Manifests, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest,
					Digest: digest.FromString("absent"), Size: 500})
			})
			return o.dir
		}, "manifests[3]"},
		{"a tar entry with ../", func(t *testing.T, o *ociMedia) string {
			return asTar(t, o, &tar.Header{Name: "blobs/../../evil", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644})
		}, `"blobs/../../evil": a path with ".."`},
		{"a tar entry with an absolute path", func(t *testing.T, o *ociMedia) string {
			return asTar(t, o, &tar.Header{Name: "/etc/evil", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644})
		}, `"/etc/evil": an absolute path`},
		{"a symlink in a tar", func(t *testing.T, o *ociMedia) string {
			return asTar(t, o, &tar.Header{Name: "blobs/sha256/x", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"})
		}, `"blobs/sha256/x": a symlink`},
		{"a hard link in a tar", func(t *testing.T, o *ociMedia) string {
			return asTar(t, o, &tar.Header{Name: "blobs/sha256/x", Typeflag: tar.TypeLink, Linkname: "oci-layout"})
		}, `"blobs/sha256/x": a hard link`},
		{"a device in a tar", func(t *testing.T, o *ociMedia) string {
			return asTar(t, o, &tar.Header{Name: "blobs/sha256/x", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 5})
		}, `"blobs/sha256/x": of type`},
		{"a symlink out of a layout directory", func(t *testing.T, o *ociMedia) string {
			p := layerOf(t, o)
			must(t, os.Remove(p))
			must(t, os.Symlink("/etc/hostname", p))
			return o.dir
		}, "a symlink leading out of"},
		{"a compressed tar", func(t *testing.T, o *ociMedia) string {
			p := asTar(t, o)
			gz := p + ".gz"
			in, _ := os.Open(p)
			out, _ := os.Create(gz)
			zw := gzip.NewWriter(out)
			io.Copy(zw, in)
			zw.Close()
			out.Close()
			in.Close()
			return gz
		}, "gzip-compressed"},
		{"no oci-layout file", func(t *testing.T, o *ociMedia) string {
			must(t, os.Remove(filepath.Join(o.dir, "oci-layout")))
			return o.dir
		}, "oci-layout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := writeOCI(t, 10)
			path := tc.media(t, o)
			e := newEnv(t, Deps{})
			_, err := e.seeder.Seed(context.Background(), path)
			if !errors.Is(err, ErrBadMedia) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a bad media error with %q", err, tc.want)
			}
			if b := e.blobs(t); len(b) != 0 {
				t.Fatalf("stored %d blobs of a bad medium", len(b))
			}
			if n, _, _ := e.store.ReleaseIngestsOf(context.Background(), IngestPrefix); n != 0 {
				t.Fatalf("left %d ingests", n)
			}
			if r := e.records(t); len(r) != 0 {
				t.Fatalf("recorded %v", r)
			}
		})
	}
}
