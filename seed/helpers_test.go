package seed

import (
	"archive/tar"
	"context"
	"io"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	ggcrlayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepin/imagepin/blobstore"
)

// env is a node: a state directory and a blob store.
type env struct {
	dir, storeDir string
	store         *blobstore.Store
	seeder        *Seeder
}

func newEnv(t *testing.T, deps Deps) *env {
	t.Helper()
	root := t.TempDir()
	e := &env{dir: Dir(filepath.Join(root, "state")), storeDir: filepath.Join(root, "blobs")}
	st, err := blobstore.Open(e.storeDir)
	if err != nil {
		t.Fatal(err)
	}
	e.store = st
	deps.Store = st
	e.seeder = New(Config{Dir: e.dir, StoreDir: e.storeDir}, deps)
	return e
}

// blobs are the digests the store holds.
func (e *env) blobs(t *testing.T) []digest.Digest {
	t.Helper()
	var out []digest.Digest
	if err := e.store.Walk(context.Background(), func(d digest.Digest, _ int64) error {
		out = append(out, d)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func (e *env) records(t *testing.T) []string {
	t.Helper()
	ents, _ := os.ReadDir(e.dir)
	var out []string
	for _, x := range ents {
		if x.Name() != lockName {
			out = append(out, x.Name())
		}
	}
	return out
}

// ociMedia writes an OCI image layout as skopeo, crane and podman do: an image named
// by a full reference, a multi-platform index named as containerd names it (its full
// name in io.containerd.image.name, the tag in org.opencontainers.image.ref.name), and
// an image with no name.
type ociMedia struct {
	dir     string
	named   v1.Image
	index   v1.ImageIndex
	unnamed v1.Image
}

func rnd(seed int64) random.Option { return random.WithSource(rand.NewSource(seed)) }

func writeOCI(t *testing.T, seed int64) *ociMedia {
	t.Helper()
	o := &ociMedia{dir: filepath.Join(t.TempDir(), "oci")}
	p, err := ggcrlayout.Write(o.dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if o.named, err = random.Image(300<<10, 2, rnd(seed)); err != nil {
		t.Fatal(err)
	}
	if o.index, err = random.Index(64<<10, 1, 2, rnd(seed+1)); err != nil {
		t.Fatal(err)
	}
	if o.unnamed, err = random.Image(1024, 1, rnd(seed+2)); err != nil {
		t.Fatal(err)
	}
	must(t, p.AppendImage(o.named, ggcrlayout.WithAnnotations(map[string]string{ocispec.AnnotationRefName: "quay.io/ns/app:v1"})))
	must(t, p.AppendIndex(o.index, ggcrlayout.WithAnnotations(map[string]string{
		AnnotationContainerdName: "registry.example.com/team/multi:2.0", ocispec.AnnotationRefName: "2.0"})))
	must(t, p.AppendImage(o.unnamed))
	return o
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// contentOf are the manifests and blobs of an image or an index.
func contentOf(t *testing.T, x any) []digest.Digest {
	t.Helper()
	var out []digest.Digest
	add := func(h v1.Hash) { out = append(out, digest.Digest(h.String())) }
	var image func(img v1.Image)
	image = func(img v1.Image) {
		d, _ := img.Digest()
		add(d)
		c, _ := img.ConfigName()
		add(c)
		ls, _ := img.Layers()
		for _, l := range ls {
			ld, _ := l.Digest()
			add(ld)
		}
	}
	switch v := x.(type) {
	case v1.Image:
		image(v)
	case v1.ImageIndex:
		d, _ := v.Digest()
		add(d)
		im, _ := v.IndexManifest()
		for _, m := range im.Manifests {
			img, err := v.Image(m.Digest)
			must(t, err)
			image(img)
		}
	}
	return out
}

// tarDir writes dir's files into a tar at out, as `tar -C dir -cf out .` does; edit
// may change each header (and return false to leave the file out); extra entries go
// at the end.
func tarDir(t *testing.T, dir, out string, edit func(h *tar.Header) bool, extra ...*tar.Header) {
	t.Helper()
	f, err := os.Create(out)
	must(t, err)
	defer f.Close()
	tw := tar.NewWriter(f)
	must(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		fi, _ := d.Info()
		h, _ := tar.FileInfoHeader(fi, "")
		h.Name = "./" + filepath.ToSlash(rel)
		if d.IsDir() {
			h.Name += "/"
		}
		if edit != nil && !edit(h) {
			return nil
		}
		must(t, tw.WriteHeader(h))
		if d.Type().IsRegular() {
			src, err := os.Open(p)
			must(t, err)
			defer src.Close()
			_, err = io.Copy(tw, src)
			must(t, err)
		}
		return nil
	}))
	for _, h := range extra {
		must(t, tw.WriteHeader(h))
		if h.Size > 0 {
			_, err := tw.Write(make([]byte, h.Size))
			must(t, err)
		}
	}
	must(t, tw.Close())
}

// writeDistribution writes the storage of a distribution registry holding the OCI
// layout's named image as ns/app:v1 and its index as team/multi:2.0 (its children as
// revisions, as a push leaves them), under root/docker/registry/v2.
func writeDistribution(t *testing.T, o *ociMedia, root string) {
	t.Helper()
	v2 := filepath.Join(root, "docker", "registry", "v2")
	blob := func(d digest.Digest) {
		src := filepath.Join(o.dir, "blobs", "sha256", d.Encoded())
		dst := filepath.Join(v2, "blobs", "sha256", d.Encoded()[:2], d.Encoded(), "data")
		must(t, os.MkdirAll(filepath.Dir(dst), 0o755))
		b, err := os.ReadFile(src)
		must(t, err)
		must(t, os.WriteFile(dst, b, 0o644))
	}
	link := func(p string, d digest.Digest) {
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, []byte(d.String()), 0o644))
	}
	repo := func(name, tag string, top digest.Digest, content []digest.Digest, manifests []digest.Digest) {
		r := filepath.Join(v2, "repositories", name)
		for _, d := range content {
			blob(d)
		}
		for _, d := range manifests {
			link(filepath.Join(r, "_manifests", "revisions", "sha256", d.Encoded(), "link"), d)
		}
		for _, d := range content {
			if !contains(manifests, d) {
				link(filepath.Join(r, "_layers", "sha256", d.Encoded(), "link"), d)
			}
		}
		link(filepath.Join(r, "_manifests", "tags", tag, "current", "link"), top)
		link(filepath.Join(r, "_manifests", "tags", tag, "index", "sha256", top.Encoded(), "link"), top)
	}
	nd, _ := o.named.Digest()
	repo("ns/app", "v1", digest.Digest(nd.String()), contentOf(t, o.named), []digest.Digest{digest.Digest(nd.String())})
	id, _ := o.index.Digest()
	im, _ := o.index.IndexManifest()
	ms := []digest.Digest{digest.Digest(id.String())}
	for _, m := range im.Manifests {
		ms = append(ms, digest.Digest(m.Digest.String()))
	}
	repo("team/multi", "2.0", digest.Digest(id.String()), contentOf(t, o.index), ms)
}

func contains(ds []digest.Digest, d digest.Digest) bool {
	for _, x := range ds {
		if x == d {
			return true
		}
	}
	return false
}

// stepClock moves a second on at every reading: every progress report is made.
type stepClock struct{ t time.Time }

func (c *stepClock) now() time.Time { c.t = c.t.Add(time.Second); return c.t }

func readFile(p string) (string, error) { b, err := os.ReadFile(p); return string(b), err }

func writeFile(p, s string) error { return os.WriteFile(p, []byte(s), 0o644) }
