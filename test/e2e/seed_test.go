//go:build e2e

package e2e

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	ggcrlayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
)

// A node with no registry at all (the images' host does not resolve, and no registry
// process runs): an OCI archive seeded with the real imagepinctl, a set naming its
// images by digest (an image, and a multi-platform index) becomes Ready through real
// CRI-O and imagepind with [peers] on: the disk check sizes them from the node's store,
// the node-local mirror serves CRI-O from it, and CRI-O holds the images with the
// seeded layers.
func TestSeededImagesNeedNoRegistry(t *testing.T) {
	const host = "seeded.example.invalid"
	if addrs, err := net.LookupHost(host); err == nil {
		t.Fatalf("%s resolves (%v): the test needs a host that does not", host, addrs)
	}
	dir := t.TempDir()
	w := worldOn(t, dir, nil)
	w.run(w.crio.Start, w.crio.Cleanup)
	port, err := env.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	w.writeConfig(worldOptions{extra: fmt.Sprintf("[peers]\nenabled = true\nmirror_address = \"127.0.0.1:%d\"\n", port)})

	// The medium: an OCI layout (an image of two layers, an index of two platforms),
	// as an archive.
	app, err := random.Image(96<<10, 2)
	if err != nil {
		t.Fatal(err)
	}
	mine, err := random.Image(64<<10, 1)
	if err != nil {
		t.Fatal(err)
	}
	otherArch := "arm64"
	if goruntime.GOARCH == "arm64" {
		otherArch = "amd64"
	}
	theirs, err := random.Image(64<<10, 1)
	if err != nil {
		t.Fatal(err)
	}
	multi := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: theirs, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: otherArch}}},
		mutate.IndexAddendum{Add: mine, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}}},
	)
	layout := filepath.Join(dir, "medium")
	p, err := ggcrlayout.Write(layout, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(app, ggcrlayout.WithAnnotations(map[string]string{ocispec.AnnotationRefName: host + "/app:v1"})); err != nil {
		t.Fatal(err)
	}
	if err := p.AppendIndex(multi, ggcrlayout.WithAnnotations(map[string]string{ocispec.AnnotationRefName: host + "/multi:v1"})); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "medium.tar")
	tarDir(t, layout, archive)
	appDigest, _ := app.Digest()
	multiDigest, _ := multi.Digest()
	refs := []string{host + "/app@" + appDigest.String(), host + "/multi@" + multiDigest.String()}

	w.startDaemon()
	start := time.Now()
	out, err := exec.Command(filepath.Join(binDir, "imagepinctl"), "seed", "--config", w.config, archive).CombinedOutput()
	if err != nil {
		t.Fatalf("imagepinctl seed: %v\n%s", err, out)
	}
	t.Logf("imagepinctl seed:\n%s", out)
	w.writeSet("seeded.yaml", alphaSet("seeded", refs...))
	n := w.waitFor("seeded Ready", 30*time.Second, phaseIs("seeded", status.Ready))
	t.Logf("seeded, then Ready %s after the seed began, with no registry", time.Since(start).Round(time.Millisecond))
	w.requirePinned(refs...)

	s := n.Set("seeded")
	if c := s.Condition(status.ConditionDiskChecked); c == nil || c.Status != status.True || !strings.Contains(c.Message, "in the node's store already") {
		t.Fatalf("DiskChecked: %+v", c)
	}
	if sd := n.Node.Seeded; sd == nil || sd.Seeds != 1 || sd.Images != 2 {
		t.Fatalf("the status's seeds: %+v", sd)
	}
	if p := n.Node.Peers; p == nil || p.FromRegistry != 0 {
		t.Fatalf("bytes from registries: %+v", p)
	}
	// CRI-O holds each image as seeded: its config, and the layers its config names.
	for ref, img := range map[string]v1.Image{refs[0]: app, refs[1]: mine} {
		cfgName, _ := img.ConfigName()
		cfg, _ := img.ConfigFile()
		id, diffIDs := w.inspect(ref)
		if id != cfgName.Hex {
			t.Fatalf("%s: CRI-O's image %s, want the seeded config %s", ref, id, cfgName.Hex)
		}
		var want []string
		for _, d := range cfg.RootFS.DiffIDs {
			want = append(want, d.String())
		}
		if !slices.Equal(diffIDs, want) {
			t.Fatalf("%s: CRI-O's layers %v, want %v", ref, diffIDs, want)
		}
	}
	// No endpoint but the node-local mirror was tried: the source does not exist.
	if w.crio.LogContains(`Trying to access \"` + host) {
		t.Fatalf("CRI-O tried the images' registry:\n%s", w.crio.LogTail(30))
	}
}

// inspect is CRI-O's image ID and the layers (diff IDs) of its config, from crictl
// inspecti.
func (w *world) inspect(ref string) (string, []string) {
	w.t.Helper()
	out, err := exec.Command(filepath.Join(env.CacheDir(), "crictl"), "--runtime-endpoint", "unix://"+w.socket(), "inspecti", "-o", "json", ref).Output()
	if err != nil {
		w.t.Fatalf("crictl inspecti %s: %v", ref, err)
	}
	var v struct {
		Status struct {
			ID string `json:"id"`
		} `json:"status"`
		Info struct {
			ImageSpec struct {
				RootFS struct {
					DiffIDs []string `json:"diff_ids"`
				} `json:"rootfs"`
			} `json:"imageSpec"`
		} `json:"info"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		w.t.Fatalf("crictl inspecti %s: %v\n%s", ref, err, out)
	}
	return strings.TrimPrefix(v.Status.ID, "sha256:"), v.Info.ImageSpec.RootFS.DiffIDs
}

// tarDir writes the files under dir into a tar at out, named relative to dir.
func tarDir(t *testing.T, dir, out string) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name, _ = filepath.Rel(dir, p)
		if d.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
}
