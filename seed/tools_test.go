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
