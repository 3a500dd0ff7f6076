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

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	ggcrlayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepin/imagepin/seed"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
	"github.com/imagepin/imagepin/test/testcerts"
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

// seedCluster is nodes on this machine, each its own CRI-O and imagepind with [peers]
// on and sharing, and no registry anywhere: their images' host does not resolve.
type seedCluster struct {
	t     *testing.T
	ca    *testcerts.CA
	addrs []string
	nodes []*world
	opts  []worldOptions
}

// newSeedCluster configures n nodes (starting none); extra(i) is more of node i's
// config; the nodes named in onContainerd run containerd instead of CRI-O.
func newSeedCluster(t *testing.T, n int, extra func(i int) string, onContainerd ...int) *seedCluster {
	t.Helper()
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "nodes-ca")
	if err != nil {
		t.Fatal(err)
	}
	c := &seedCluster{t: t, ca: ca}
	port, err := env.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		c.addrs = append(c.addrs, fmt.Sprintf("127.0.0.%d:%d", 2+i, port))
	}
	for i := range n {
		nd := t.TempDir()
		w := worldOn(t, nd, nil)
		if slices.Contains(onContainerd, i) {
			ctr, err := env.NewContainerd(filepath.Join(nd, "containerd"), env.ContainerdOptions{})
			if err != nil {
				t.Fatal(err)
			}
			w.ctr = ctr
		}
		name := fmt.Sprintf("node-%d", i)
		w.nodeName = name
		serving, err := ca.NodeServing(nd, name, net.ParseIP(fmt.Sprintf("127.0.0.%d", 2+i)))
		if err != nil {
			t.Fatal(err)
		}
		client, err := ca.Node(nd, name)
		if err != nil {
			t.Fatal(err)
		}
		mport, err := env.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, w)
		c.opts = append(c.opts, worldOptions{extra: fmt.Sprintf(`[peers]
enabled = true
mirror_address = "127.0.0.1:%d"
address = %q
nodes = ["%s"]
cert = %q
ca = %q
client_cert = %q
client_ca = %q
`, mport, c.addrs[i], strings.Join(c.addrs, `", "`), serving, ca.File, client, ca.File) + extra(i)})
	}
	return c
}

// start starts node i's CRI-O and imagepind.
func (c *seedCluster) start(i int) *world {
	w := c.nodes[i]
	if w.ctr != nil {
		w.run(w.ctr.Start, w.ctr.Cleanup)
	} else {
		w.run(w.crio.Start, w.crio.Cleanup)
	}
	w.writeConfig(c.opts[i])
	w.startDaemon()
	return w
}

// requirePinnedOn is requirePinned on CRI-O, the pinned label on containerd.
func (w *world) requirePinnedOn(refs ...string) {
	w.t.Helper()
	if w.ctr == nil {
		w.requirePinned(refs...)
		return
	}
	for _, r := range refs {
		if !w.labelled(r) {
			w.t.Fatalf("%s is not pinned (labelled) on %s", r, w.nodeName)
		}
	}
}

// requireLayers checks that CRI-O on w holds each image as made: its config, and the
// layers the config names.
func (w *world) requireLayers(images map[string]v1.Image) {
	w.t.Helper()
	for ref, img := range images {
		cfgName, _ := img.ConfigName()
		cfg, _ := img.ConfigFile()
		id, diffIDs := w.inspect(ref)
		if id != cfgName.Hex {
			w.t.Fatalf("%s on %s: CRI-O's image %s, want the seeded config %s", ref, w.nodeName, id, cfgName.Hex)
		}
		var want []string
		for _, d := range cfg.RootFS.DiffIDs {
			want = append(want, d.String())
		}
		if !slices.Equal(diffIDs, want) {
			w.t.Fatalf("%s on %s: CRI-O's layers %v, want %v", ref, w.nodeName, diffIDs, want)
		}
	}
}

// distributionArchive pushes img to a registry process of its own as repo:tag, stops
// it and tars its storage (docker/registry/v2/...): what oc-mirror archives.
func distributionArchive(t *testing.T, dir, repo, tag string, img v1.Image) string {
	t.Helper()
	regDir := filepath.Join(dir, "medium-registry")
	if err := os.MkdirAll(regDir, 0o755); err != nil {
		t.Fatal(err)
	}
	reg, err := env.StartRegistry(regDir)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(reg.Host+"/"+repo+":"+tag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	err = remote.Write(ref, img)
	reg.Stop()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "mirror_000001.tar")
	tarDir(t, filepath.Join(regDir, "data"), out)
	return out
}

// One node seeded, with no registry anywhere: an OCI archive dropped into its seed
// directory ([seed] directory) and a registry's storage archive (oc-mirror's kind)
// seeded with imagepinctl. Three CRI-O nodes pin the set: every one Ready, 0 bytes
// from any registry, every image's layers right, the other two reading from the
// seeded node through the peers (its summary of what it holds says whom to ask).
// Then a fourth node, on containerd, joins and reads everything from its peers.
func TestOneSeedForTheWholeCluster(t *testing.T) {
	const host = "seeded.example.invalid"
	if addrs, err := net.LookupHost(host); err == nil {
		t.Fatalf("%s resolves (%v): the test needs a host that does not", host, addrs)
	}
	dir := t.TempDir()
	seedDir := filepath.Join(dir, "seed.d")
	if err := os.Mkdir(seedDir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := newSeedCluster(t, 4, func(i int) string {
		if i == 0 {
			return fmt.Sprintf("[seed]\ndirectory = %q\nsettle = \"1s\"\n", seedDir)
		}
		return ""
	}, 3)
	app, err := random.Image(256<<10, 3)
	if err != nil {
		t.Fatal(err)
	}
	tool, err := random.Image(128<<10, 2)
	if err != nil {
		t.Fatal(err)
	}
	dist, err := random.Image(192<<10, 2)
	if err != nil {
		t.Fatal(err)
	}
	layout := filepath.Join(dir, "medium")
	p, err := ggcrlayout.Write(layout, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for ref, img := range map[string]v1.Image{host + "/ns/app:v1": app, host + "/ns/tool:v1": tool} {
		if err := p.AppendImage(img, ggcrlayout.WithAnnotations(map[string]string{ocispec.AnnotationRefName: ref})); err != nil {
			t.Fatal(err)
		}
	}
	ociArchive := filepath.Join(dir, "release.tar")
	tarDir(t, layout, ociArchive)
	distArchive := distributionArchive(t, dir, "mirror/dist", "v1", dist)
	images := map[string]v1.Image{}
	var refs []string
	var total int64
	for repo, img := range map[string]v1.Image{host + "/ns/app": app, host + "/ns/tool": tool, host + "/mirror/dist": dist} {
		d, _ := img.Digest()
		ref := repo + "@" + d.String()
		images[ref] = img
		refs = append(refs, ref)
		ls, _ := img.Layers()
		for _, l := range ls {
			s, _ := l.Size()
			total += s
		}
	}
	slices.Sort(refs)

	seeded := c.start(0)
	start := time.Now()
	// The OCI archive copied into the seed directory as an administrator would: under
	// a hidden name, then renamed.
	data, err := os.ReadFile(ociArchive)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(seedDir, ".release.tar.tmp"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(seedDir, ".release.tar.tmp"), filepath.Join(seedDir, "release.tar")); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(binDir, "imagepinctl"), "seed", "--config", seeded.config, "--registry", host, distArchive).CombinedOutput()
	if err != nil {
		t.Fatalf("imagepinctl seed: %v\n%s", err, out)
	}
	t.Logf("imagepinctl seed:\n%s", out)
	seeds := seed.Dir(filepath.Join(seeded.dir, "state"))
	completeSeeds := func() int {
		recs, _ := seed.Records(seeds)
		n := 0
		for _, r := range recs {
			if r.Complete {
				n++
			}
		}
		return n
	}
	waitUntil(t, "node-0's seed directory seeded", 30*time.Second, func() bool { return completeSeeds() == 2 })
	t.Logf("node-0 seeded from its directory and imagepinctl in %s", time.Since(start).Round(time.Millisecond))

	first := []*world{seeded, c.start(1), c.start(2)}
	start = time.Now()
	for _, w := range first {
		w.writeSet("seeded.yaml", alphaSet("seeded", refs...))
	}
	for _, w := range first {
		w.waitFor(w.nodeName+" Ready", 120*time.Second, phaseIs("seeded", status.Ready))
	}
	t.Logf("3 nodes Ready %s after the set came, from one seed", time.Since(start).Round(time.Millisecond))
	var fromPeers int64
	for _, w := range first {
		w.requirePinned(refs...)
		w.requireLayers(images)
		p := peerBytes(w)
		t.Logf("%s: %+v", w.nodeName, p)
		if p.FromRegistry != 0 {
			t.Fatalf("%s read %d bytes from a registry", w.nodeName, p.FromRegistry)
		}
		fromPeers += p.FromPeers
		if w.crio.LogContains(`Trying to access \"` + host) {
			t.Fatalf("%s: CRI-O tried the images' registry:\n%s", w.nodeName, w.crio.LogTail(30))
		}
	}
	if fromPeers < 2*total {
		t.Fatalf("the two nodes without the seed read %d bytes from peers; the set's layers are %d each", fromPeers, total)
	}
	// The fourth node, listed but not started yet, is the only peer set aside.
	for _, w := range first {
		log, _ := os.ReadFile(filepath.Join(w.dir, "imagepind.log"))
		for _, line := range strings.Split(string(log), "\n") {
			if strings.Contains(line, "setting a peer aside") && !strings.Contains(line, `peer="`+c.addrs[3]+`"`) {
				t.Errorf("%s set a running peer aside: %s", w.nodeName, line)
			}
		}
	}

	late := c.start(3)
	start = time.Now()
	late.writeSet("seeded.yaml", alphaSet("seeded", refs...))
	late.waitFor("the fourth node (containerd) Ready", 120*time.Second, phaseIs("seeded", status.Ready))
	late.requirePinnedOn(refs...)
	late.requireLayers(images)
	lp := peerBytes(late)
	t.Logf("the fourth node Ready in %s from its peers: %+v", time.Since(start).Round(time.Millisecond), lp)
	if lp.FromRegistry != 0 || lp.FromPeers < total {
		t.Fatalf("the fourth node: %d bytes from a registry, %d from peers (the set's layers are %d)", lp.FromRegistry, lp.FromPeers, total)
	}

	// The OCI archive taken out of the seed directory: its seed goes (the set still
	// pins its images: their blobs stay), the other seed stays.
	if err := os.Remove(filepath.Join(seedDir, "release.tar")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "node-0's seed of the removed archive gone", 30*time.Second, func() bool { return completeSeeds() == 1 })
	seeded.requirePinned(refs...)
	if sd := seeded.readStatus().Node.Seeded; sd == nil || sd.Seeds < 1 {
		t.Fatalf("node-0's status: seeds %+v", sd)
	}
	log, _ := os.ReadFile(filepath.Join(seeded.dir, "imagepind.log"))
	for _, want := range []string{"seed directory: seeded", "seed directory: medium taken away or replaced; its seed is removed"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("node-0's log lacks %q", want)
		}
	}
}

// imagepinctl seed killed (-9) in the middle of a layer, then run again: nothing of the
// image is served meanwhile (CRI-O cannot pull it, the set is not Ready), and the
// second run goes on from what the first wrote and completes it; the set is then Ready
// with every layer right.
func TestSeedKilledMidwayResumes(t *testing.T) {
	const host = "seeded.example.invalid"
	dir := t.TempDir()
	w := worldOn(t, dir, nil)
	w.run(w.crio.Start, w.crio.Cleanup)
	port, err := env.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	w.writeConfig(worldOptions{extra: fmt.Sprintf("[peers]\nenabled = true\nmirror_address = \"127.0.0.1:%d\"\n", port)})
	img, err := random.Image(96<<20, 3)
	if err != nil {
		t.Fatal(err)
	}
	layout := filepath.Join(dir, "medium")
	p, err := ggcrlayout.Write(layout, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, ggcrlayout.WithAnnotations(map[string]string{ocispec.AnnotationRefName: host + "/big:v1"})); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "big.tar")
	tarDir(t, layout, archive)
	if err := os.RemoveAll(layout); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	ref := host + "/big@" + d.String()
	w.startDaemon()
	w.writeSet("big.yaml", alphaSet("big", ref))

	// Killed once a layer is partly written (a "seed-" ingest holding bytes).
	ctl := filepath.Join(binDir, "imagepinctl")
	cmd := exec.Command(ctl, "seed", "--config", w.config, archive)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ingests := filepath.Join(dir, "state", "blobs", "ingest")
	partly := func() bool {
		refs, _ := filepath.Glob(filepath.Join(ingests, "*", "ref"))
		for _, r := range refs {
			b, _ := os.ReadFile(r)
			if fi, err := os.Stat(filepath.Join(filepath.Dir(r), "data")); err == nil && strings.HasPrefix(string(b), "seed-") && fi.Size() > 1<<20 {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(60 * time.Second)
	for !partly() {
		if time.Now().After(deadline) {
			t.Fatal("imagepinctl seed wrote no layer within 60s")
		}
		time.Sleep(2 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	out, err := exec.Command(ctl, "seed", "--config", w.config, "--list").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "incomplete") {
		t.Fatalf("imagepinctl seed --list after the kill: %v\n%s", err, out)
	}
	t.Logf("killed mid-seed; --list:\n%s", out)
	// Nothing half imported is served: the image cannot be pulled, the set waits.
	time.Sleep(3 * time.Second)
	if im := w.image(ref); im.Present {
		t.Fatalf("%s is in CRI-O after a seed cut short", ref)
	}
	if n := w.readStatus(); n.Set("big") != nil && n.Set("big").Phase == status.Ready {
		t.Fatal("the set is Ready after a seed cut short")
	}

	out, err = exec.Command(ctl, "seed", "--config", w.config, archive).CombinedOutput()
	if err != nil {
		t.Fatalf("imagepinctl seed again: %v\n%s", err, out)
	}
	t.Logf("seeded again:\n%s", out)
	if !strings.Contains(string(out), "an interrupted seed had written") {
		t.Fatalf("the second run did not go on from the first's bytes:\n%s", out)
	}
	w.waitFor("big Ready", 120*time.Second, phaseIs("big", status.Ready))
	w.requirePinned(ref)
	w.requireLayers(map[string]v1.Image{ref: img})
}
