package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	godigest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepin/imagepin/seed"
)

func TestSeedListRemove(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	cfg := write(t, dir, "c.toml", "state_dir = \""+state+"\"\n[peers]\nenabled = true\n")
	media := filepath.Join(dir, "layout")
	p, err := layout.Write(media, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	img, _ := random.Image(10000, 2)
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{ocispec.AnnotationRefName: "quay.io/ns/app:v1"})); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()

	code, out, errOut := ctl(t, "--config", cfg, "seed", media)
	if code != 0 || !strings.Contains(out, "1 images, 1 repositories, 1 tags") || !strings.Contains(out, "quay.io/ns/app:v1@"+d.String()) {
		t.Fatalf("seed: %d\n%s%s", code, out, errOut)
	}
	id := strings.Fields(strings.SplitN(out, "seed ", 2)[1])[0]
	id = strings.TrimSuffix(id, ":")
	if _, err := os.Stat(filepath.Join(state, "seeds", id+".json")); err != nil {
		t.Fatalf("record: %v", err)
	}
	code, out, _ = ctl(t, "--config", cfg, "seed", media)
	if code != 0 || !strings.Contains(out, "nothing written") {
		t.Fatalf("seed again: %d\n%s", code, out)
	}
	code, out, _ = ctl(t, "--config", cfg, "seed", "--list")
	if code != 0 || !strings.Contains(out, id+"  1 images") || !strings.Contains(out, "from "+media) {
		t.Fatalf("list: %d\n%s", code, out)
	}

	saved := filepath.Join(dir, "saved.tar")
	f, _ := os.Create(saved)
	ref, _ := name.NewTag("quay.io/ns/app:v1")
	tarball.Write(ref, img, f)
	f.Close()
	code, _, errOut = ctl(t, "--config", cfg, "seed", saved)
	if code != exitNo || !strings.Contains(errOut, "docker-archive") {
		t.Fatalf("docker-archive: %d %s", code, errOut)
	}

	code, out, errOut = ctl(t, "--config", cfg, "seed", "--remove", id)
	if code != 0 || !strings.Contains(out, "removed seed "+id+": 4 manifests and blobs") {
		t.Fatalf("remove: %d\n%s%s", code, out, errOut)
	}
	code, _, errOut = ctl(t, "--config", cfg, "seed", "--remove", id)
	if code != exitNo || !strings.Contains(errOut, "no such seed") {
		t.Fatalf("remove again: %d %s", code, errOut)
	}

	off := write(t, dir, "off.toml", "state_dir = \""+state+"\"\n")
	if code, _, errOut := ctl(t, "--config", off, "seed", media); code != exitUsage || !strings.Contains(errOut, "[peers] is off") {
		t.Fatalf("[peers] off: %d %s", code, errOut)
	}
}

// A seed holding a pinned name with another digest (a medium whose images were
// converted) is a warning of imagepinctl seed and of seed --list; the seed directory's
// media that imagepind refused are listed by --list, naming each file.
func TestSeedSaysWhatIsNotAsPinned(t *testing.T) {
	dir := t.TempDir()
	state, sets, seedDir := filepath.Join(dir, "state"), filepath.Join(dir, "sets"), filepath.Join(dir, "seed.d")
	for _, d := range []string{sets, seedDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg := write(t, dir, "c.toml", "state_dir = \""+state+"\"\nsets_dir = \""+sets+"\"\n[peers]\nenabled = true\n[seed]\ndirectory = \""+seedDir+"\"\n")
	media := filepath.Join(dir, "layout")
	p, err := layout.Write(media, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	img, _ := random.Image(10000, 2)
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{ocispec.AnnotationRefName: "quay.io/ns/app:v1"})); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	// The set pins the registry's digest of app:v1; the medium holds another.
	pinned := "quay.io/ns/app:v1@" + godigest.FromString("the registry's manifest").String()
	write(t, sets, "app.yaml", "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: app}\nspec:\n  pinnedImages:\n  - name: "+pinned+"\n")

	code, _, errOut := ctl(t, "--config", cfg, "seed", media)
	want := "warning: pinned " + pinned + " is not seeded: the seeds hold quay.io/ns/app:v1 as " + d.String()
	if code != 0 || !strings.Contains(errOut, want) {
		t.Fatalf("seed: %d, stderr %q, want %q", code, errOut, want)
	}
	bad := filepath.Join(seedDir, "release.tar")
	if err := seed.WriteMediaFaults(seed.Dir(state), seed.MediaFaults{Directory: seedDir, Updated: time.Now(),
		Media: []seed.MediaFault{{Path: bad, Fault: "refused, nothing of it stored: bad media: a truncated tar"}}}); err != nil {
		t.Fatal(err)
	}
	code, out, _ := ctl(t, "--config", cfg, "seed", "--list")
	if code != 0 || !strings.Contains(out, "seed directory "+seedDir+": 1 medium not seeded") ||
		!strings.Contains(out, bad+": refused, nothing of it stored: bad media: a truncated tar") || !strings.Contains(out, want) {
		t.Fatalf("list: %d\n%s", code, out)
	}
}
