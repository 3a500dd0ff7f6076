package seed

import (
	"archive/tar"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/blobstore"
)

func refs(images []Image) []string {
	var out []string
	for _, i := range images {
		out = append(out, i.Ref())
	}
	sort.Strings(out)
	return out
}

func wantAll(t *testing.T, e *env, ds []digest.Digest) {
	t.Helper()
	have := map[digest.Digest]bool{}
	for _, d := range e.blobs(t) {
		have[d] = true
	}
	for _, d := range ds {
		if !have[d] {
			t.Errorf("the store lacks %s", d)
		}
	}
}

func TestSeedOCIDirectoryThenTarThenAgain(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, Deps{})
	o := writeOCI(t, 1)
	sum, err := e.seeder.Seed(ctx, o.dir)
	if err != nil {
		t.Fatal(err)
	}
	nd, _ := o.named.Digest()
	id, _ := o.index.Digest()
	ud, _ := o.unnamed.Digest()
	want := []string{
		"(no name)@" + ud.String(),
		"quay.io/ns/app:v1@" + nd.String(),
		"registry.example.com/team/multi:2.0@" + id.String(),
	}
	if got := refs(sum.Images); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("images %v, want %v", got, want)
	}
	if sum.Repositories != 2 || sum.Tags != 2 || !sum.Recorded || sum.Written != sum.Bytes || sum.Format != FormatOCI {
		t.Fatalf("summary %+v", sum)
	}
	all := append(append(contentOf(t, o.named), contentOf(t, o.index)...), contentOf(t, o.unnamed)...)
	wantAll(t, e, all)
	if len(e.blobs(t)) != len(all) {
		t.Fatalf("the store holds %d blobs, the media %d", len(e.blobs(t)), len(all))
	}
	rec, err := readRecord(filepath.Join(e.dir, sum.ID+recordExt))
	if err != nil || !rec.Complete || len(rec.Media) != 1 || rec.Media[0].Kind != "directory" {
		t.Fatalf("record %+v, %v", rec, err)
	}
	if len(rec.Manifests)+len(rec.Blobs) != len(all) {
		t.Fatalf("the record names %d manifests and %d blobs, the media has %d", len(rec.Manifests), len(rec.Blobs), len(all))
	}

	// The same images from a tar: nothing to write, the medium added to the record.
	tarPath := filepath.Join(t.TempDir(), "app.oci.tar")
	tarDir(t, o.dir, tarPath, nil)
	sum2, err := e.seeder.Seed(ctx, tarPath)
	if err != nil {
		t.Fatal(err)
	}
	if sum2.ID != sum.ID || sum2.Written != 0 || sum2.PresentN != len(all) || sum2.Present != sum.Bytes {
		t.Fatalf("the tar: %+v", sum2)
	}
	rec, _ = readRecord(filepath.Join(e.dir, sum.ID+recordExt))
	if len(rec.Media) != 2 || rec.Media[1].Kind != "tar" {
		t.Fatalf("media %+v", rec.Media)
	}

	// Seeded again: nothing is written, not even the record.
	fi, _ := os.Stat(filepath.Join(e.dir, sum.ID+recordExt))
	for _, p := range []string{o.dir, tarPath} {
		sum3, err := e.seeder.Seed(ctx, p)
		if err != nil || sum3.Written != 0 || sum3.Recorded {
			t.Fatalf("seeding %s again: %+v, %v", p, sum3, err)
		}
	}
	fi2, _ := os.Stat(filepath.Join(e.dir, sum.ID+recordExt))
	if !fi2.ModTime().Equal(fi.ModTime()) {
		t.Fatal("seeding again rewrote the record")
	}
	if got := e.records(t); len(got) != 1 {
		t.Fatalf("records %v", got)
	}
}

// A tag-only name takes its repository from Names.Repository.
func TestSeedOCITagOnlyNames(t *testing.T) {
	o := writeOCI(t, 2)
	// As skopeo copy ... oci:DIR:v1 writes it.
	raw, _ := os.ReadFile(filepath.Join(o.dir, "index.json"))
	os.WriteFile(filepath.Join(o.dir, "index.json"), []byte(strings.Replace(string(raw), "quay.io/ns/app:v1", "v1", 1)), 0o644)
	for _, repo := range []string{"", "quay.io/ns/app"} {
		e := newEnv(t, Deps{})
		e.seeder.cfg.Names.Repository = repo
		sum, err := e.seeder.Seed(context.Background(), o.dir)
		if err != nil {
			t.Fatal(err)
		}
		var got Image
		for _, i := range sum.Images {
			if i.Tag == "v1" {
				got = i
			}
		}
		if got.Repository != repo || got.MediaName != "v1" {
			t.Fatalf("with repository %q: %+v", repo, got)
		}
	}
}

func TestSeedDistributionDirectoryAndTar(t *testing.T) {
	ctx := context.Background()
	o := writeOCI(t, 3)
	root := filepath.Join(t.TempDir(), "cache")
	writeDistribution(t, o, root)
	// oc-mirror's archive: the cache's docker/registry/v2 beside its working-dir.
	os.MkdirAll(filepath.Join(root, "working-dir"), 0o755)
	os.WriteFile(filepath.Join(root, "working-dir", "notes"), []byte("x"), 0o644)
	archive := filepath.Join(t.TempDir(), "mirror_000001.tar")
	tarDir(t, root, archive, func(h *tar.Header) bool { h.Name = strings.TrimPrefix(h.Name, "./"); return true })
	nd, _ := o.named.Digest()
	id, _ := o.index.Digest()
	for _, tc := range []struct{ path, registry, kind string }{
		{root, "quay.io", "directory"},
		{filepath.Join(root, "docker", "registry", "v2"), "", "directory"},
		{archive, "quay.io", "tar"},
		{filepath.Dir(archive), "quay.io", "tars"},
	} {
		e := newEnv(t, Deps{})
		e.seeder.cfg.Names.Registry = tc.registry
		sum, err := e.seeder.Seed(ctx, tc.path)
		if err != nil {
			t.Fatalf("%s: %v", tc.path, err)
		}
		want := []string{"ns/app:v1@" + nd.String(), "team/multi:2.0@" + id.String()}
		if tc.registry != "" {
			want = []string{"quay.io/ns/app:v1@" + nd.String(), "quay.io/team/multi:2.0@" + id.String()}
		}
		if got := refs(sum.Images); strings.Join(got, " ") != strings.Join(want, " ") || sum.Format != FormatDistribution {
			t.Fatalf("%s: images %v, want %v (the index's children are no images of their own)", tc.path, got, want)
		}
		wantAll(t, e, append(contentOf(t, o.named), contentOf(t, o.index)...))
		rec, _ := readRecord(filepath.Join(e.dir, sum.ID+recordExt))
		if rec.Media[0].Kind != tc.kind {
			t.Fatalf("%s: kind %q, want %q", tc.path, rec.Media[0].Kind, tc.kind)
		}
	}
}

func TestDockerArchiveIsRefused(t *testing.T) {
	o := writeOCI(t, 4)
	p := filepath.Join(t.TempDir(), "saved.tar")
	f, _ := os.Create(p)
	ref, _ := name.NewTag("quay.io/ns/app:v1")
	must(t, tarball.Write(ref, o.named, f))
	f.Close()
	e := newEnv(t, Deps{})
	_, err := e.seeder.Seed(context.Background(), p)
	if !errors.Is(err, ErrBadMedia) || !strings.Contains(err.Error(), "docker-archive") || !strings.Contains(err.Error(), "skopeo copy docker-archive:"+p+" oci-archive:") {
		t.Fatalf("got %v", err)
	}
	if len(e.blobs(t)) != 0 {
		t.Fatal("stored something of a docker-archive")
	}
}

func TestFreeSpaceIsCheckedFirst(t *testing.T) {
	o := writeOCI(t, 5)
	var asked string
	e := newEnv(t, Deps{Free: func(dir string) (int64, error) { asked = dir; return 1000, nil }})
	_, err := e.seeder.Seed(context.Background(), o.dir)
	if !errors.Is(err, ErrNoSpace) || asked != e.storeDir {
		t.Fatalf("got %v (asked about %q)", err, asked)
	}
	if len(e.blobs(t)) != 0 || len(e.records(t)) != 0 {
		t.Fatalf("stored %v, recorded %v", e.blobs(t), e.records(t))
	}
	// What the store holds counts as present: with the named image stored, the rest fits.
	e.seeder.deps.Free = freeSpace
	sub := filepath.Join(t.TempDir(), "one")
	must(t, os.MkdirAll(sub, 0o755))
	tarDir(t, o.dir, filepath.Join(sub, "x.tar"), nil)
	if _, err := e.seeder.Seed(context.Background(), o.dir); err != nil {
		t.Fatal(err)
	}
	need := int64(0)
	e.seeder.deps.Free = func(string) (int64, error) { return need, nil }
	if sum, err := e.seeder.Seed(context.Background(), filepath.Join(sub, "x.tar")); err != nil || sum.Written != 0 {
		t.Fatalf("all present, no free space: %+v %v", sum, err)
	}
}

// A seed cancelled in the middle of a blob leaves its pending record and the ingest;
// run again, it goes on from the ingest's bytes and records the seed.
func TestSeedResumesAfterAnInterruption(t *testing.T) {
	o := writeOCI(t, 6)
	clock := &stepClock{}
	ctx, cancel := context.WithCancel(context.Background())
	var reports int
	e := newEnv(t, Deps{Now: clock.now, Progress: func(p Progress) {
		reports++
		if p.Done >= copyBuf { // one buffer into the first 300 KiB layer
			cancel()
		}
	}})
	_, err := e.seeder.Seed(ctx, o.dir)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted seed: %v", err)
	}
	recs := e.records(t)
	if len(recs) != 1 || !strings.HasSuffix(recs[0], pendingExt) {
		t.Fatalf("after the interruption: records %v, want one pending", recs)
	}
	ds, err := Digests(e.dir)
	if err != nil || len(ds) == 0 {
		t.Fatalf("a pending record names nothing for the prune to keep: %v", err)
	}
	// A new process (kill -9 is the same to the store: the ingest stays).
	st2, err := blobstore.Open(e.storeDir)
	must(t, err)
	e.store = st2
	sum, err := New(e.seeder.cfg, Deps{Store: st2}).Seed(context.Background(), o.dir)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Resumed == 0 || !sum.Recorded {
		t.Fatalf("resumed %d bytes (want > 0): %+v", sum.Resumed, sum)
	}
	if recs := e.records(t); len(recs) != 1 || recs[0] != sum.ID+recordExt {
		t.Fatalf("records %v", recs)
	}
	wantAll(t, e, append(append(contentOf(t, o.named), contentOf(t, o.index)...), contentOf(t, o.unnamed)...))
	if reports == 0 {
		t.Fatal("no progress reported")
	}
}
