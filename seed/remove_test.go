package seed

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	ggcrlayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Removing a seed takes its record and the blobs no other seed and no pin needs.
func TestRemoveKeepsWhatOthersNeed(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, Deps{})
	a := writeOCI(t, 20)
	b := writeOCI(t, 20) // the same images...
	editName(t, b, "quay.io/ns/app:v1", "quay.io/ns/other:v1")
	sa, err := e.seeder.Seed(ctx, a.dir)
	must(t, err)
	sb, err := e.seeder.Seed(ctx, b.dir)
	must(t, err)
	if sa.ID == sb.ID || sb.Written != 0 {
		t.Fatalf("two seeds of the same content: %s %s, wrote %d", sa.ID, sb.ID, sb.Written)
	}
	// b goes: a needs all of it.
	r, err := e.seeder.Remove(ctx, b.dir, nil)
	if err != nil || r.ID != sb.ID || r.Blobs != 0 {
		t.Fatalf("remove by path: %+v %v", r, err)
	}
	all := len(e.blobs(t))
	// a goes, by an id prefix, with the index pinned: the index and what it names stay.
	id, _ := a.index.Digest()
	pinned := []string{"registry.example.com/team/multi@" + id.String(), "quay.io/*"}
	r, err = e.seeder.Remove(ctx, sa.ID[:8], pinned)
	if err != nil {
		t.Fatal(err)
	}
	kept := contentOf(t, a.index)
	if left := e.blobs(t); len(left) != len(kept) || r.Blobs != all-len(kept) {
		t.Fatalf("left %d blobs (removed %d), want the pinned index's %d", len(left), r.Blobs, len(kept))
	}
	wantAll(t, e, kept)
	if recs := e.records(t); len(recs) != 0 {
		t.Fatalf("records left: %v", recs)
	}
	if _, err := e.seeder.Remove(ctx, sa.ID, nil); !errors.Is(err, ErrNoSeed) {
		t.Fatalf("removing it again: %v", err)
	}
}

func editName(t *testing.T, o *ociMedia, from, to string) {
	t.Helper()
	p := filepath.Join(o.dir, "index.json")
	raw, err := readFile(p)
	must(t, err)
	must(t, writeFile(p, strings.Replace(raw, from, to, 1)))
}

// Media skopeo writes (oci: and oci-archive:, and its docker-archive: refused), when
// skopeo is installed (hack/e2e-deps.sh installs it); local transports only, no network.
func TestMediaSkopeoWrites(t *testing.T) {
	skopeo, err := exec.LookPath("skopeo")
	if err != nil {
		t.Skip("skopeo is not installed (hack/e2e-deps.sh installs it)")
	}
	// skopeo 1.9 finds only OCI-typed manifests in a layout's index.json.
	img, err := mutate.AppendLayers(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON))
	must(t, err)
	for i := int64(0); i < 2; i++ {
		l, err := random.Layer(100<<10, types.OCILayer, rnd(30+i))
		must(t, err)
		img, err = mutate.AppendLayers(img, l)
		must(t, err)
	}
	srcDir := filepath.Join(t.TempDir(), "src")
	p, err := ggcrlayout.Write(srcDir, empty.Index)
	must(t, err)
	must(t, p.AppendImage(img, ggcrlayout.WithAnnotations(map[string]string{ocispec.AnnotationRefName: "quay.io/ns/app:v1"})))
	out := t.TempDir()
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command(skopeo, append([]string{"--insecure-policy", "copy", "-q"}, args...)...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("skopeo %v: %v\n%s", args, err, b)
		}
	}
	from := "oci:" + srcDir + ":quay.io/ns/app:v1" // skopeo 1.9 reads an image of a layout by its ref.name
	ociDir := filepath.Join(out, "layout")
	ociTar := filepath.Join(out, "app.tar")
	docker := filepath.Join(out, "docker.tar")
	run(from, "oci:"+ociDir+":v1")
	run(from, "oci-archive:"+ociTar+":quay.io/ns/app:v1")
	run(from, "docker-archive:"+docker+":quay.io/ns/app:v1")
	ctx := context.Background()
	for _, tc := range []struct{ path, want string }{
		{ociDir, "quay.io/ns/app:v1"}, // the tag, and --repository
		{ociTar, "quay.io/ns/app:v1"},
	} {
		e := newEnv(t, Deps{})
		e.seeder.cfg.Names.Repository = "quay.io/ns/app"
		sum, err := e.seeder.Seed(ctx, tc.path)
		if err != nil {
			t.Fatalf("%s: %v", tc.path, err)
		}
		if len(sum.Images) != 1 || !strings.HasPrefix(sum.Images[0].Ref(), tc.want+"@") {
			t.Fatalf("%s: images %+v", tc.path, sum.Images)
		}
		if _, ok := e.store.Size(ctx, digest.Digest(sum.Images[0].Digest)); !ok {
			t.Fatalf("%s: the manifest is not stored", tc.path)
		}
	}
	e := newEnv(t, Deps{})
	if _, err := e.seeder.Seed(ctx, docker); !errors.Is(err, ErrBadMedia) || !strings.Contains(err.Error(), "docker-archive") {
		t.Fatalf("skopeo's docker-archive: %v", err)
	}
}
