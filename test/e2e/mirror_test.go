//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/crio"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
)

// The node-local mirror ([peers] on one node): CRI-O pulls the
// pinned images through imagepind's mirror, which keeps their blobs; with the registry
// gone, an image removed from CRI-O's storage is pulled again from the node's own store.
// An unpinned image goes straight to its registry, and with imagepind stopped CRI-O
// pulls from the registry as without imagepin.
func TestNodeLocalMirrorServesPinnedImages(t *testing.T) {
	w := newWorld(t)
	port, err := env.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	mirrorAddr := fmt.Sprintf("127.0.0.1:%d", port)
	w.writeConfig(worldOptions{metrics: true, extra: fmt.Sprintf("[peers]\nenabled = true\nmirror_address = %q\n", mirrorAddr)})
	refs := w.push("mirrored", 2)
	w.startDaemon()
	w.writeSet("mirrored.yaml", alphaSet("mirrored", refs...))
	w.waitFor("mirrored Ready", 60*time.Second, phaseIs("mirrored", status.Ready))
	w.requirePinned(refs...)

	dropIn := filepath.Join(w.crio.RegistriesConfDir(), crio.MirrorDropInName)
	data, err := os.ReadFile(dropIn)
	at := mirrorAddr + "/" + strings.Replace(w.reg.Host, ":", "_", 1) // mirror.PathFor
	if err != nil || !strings.Contains(string(data), at) {
		t.Fatalf("mirror drop-in %s: %v\n%s", dropIn, err, data)
	}
	// CRI-O took the pulls to the mirror first (containers/image logs each endpoint it tries).
	if !w.crio.LogContains(`Trying to access \"` + at) {
		t.Fatalf("CRI-O never tried the node-local mirror:\n%s", w.crio.LogTail(30))
	}
	store, err := blobstore.Open(filepath.Join(w.dir, "state", "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	used, _ := store.Usage(context.Background())
	if used < 2*64<<10 {
		t.Fatalf("the mirror's store holds %d bytes; the two images' layers alone are %d", used, 2*64<<10)
	}
	t.Logf("the node-local store holds %d bytes for 2 images of one 64 KiB layer each", used)

	crictl := func(args ...string) (string, error) {
		out, err := exec.Command(filepath.Join(env.CacheDir(), "crictl"), append([]string{"--runtime-endpoint", "unix://" + w.socket()}, args...)...).CombinedOutput()
		return string(out), err
	}
	// The registry gone: an image removed from CRI-O's storage comes back from the store.
	w.reg.Stop()
	if out, err := crictl("rmi", refs[0]); err != nil {
		t.Fatalf("crictl rmi: %v %s", err, out)
	}
	start := time.Now()
	if out, err := crictl("pull", refs[0]); err != nil {
		t.Fatalf("with the registry gone, pulling a pinned image failed: %v\n%s\n%s", err, out, w.crio.LogTail(20))
	}
	t.Logf("with the registry gone, %s pulled again from the node's own store in %s", refs[0], time.Since(start).Round(time.Millisecond))
	// The counters say where the bytes came from.
	served := map[string]float64{}
	for _, line := range strings.Split(scrape(t, w), "\n") {
		for key, prefix := range map[string]string{
			"store":         `imagepin_mirror_served_bytes_total{from="store"} `,
			"transfer":      `imagepin_mirror_served_bytes_total{from="transfer"} `,
			"from_registry": `imagepin_peer_bytes_total{direction="from_registry"} `,
		} {
			if v, ok := strings.CutPrefix(line, prefix); ok {
				var n float64
				fmt.Sscan(v, &n)
				served[key] = n
			}
		}
	}
	t.Logf("mirror counters: %v", served)
	if served["transfer"] < 2*64<<10 || served["from_registry"] < 2*64<<10 || served["store"] < 64<<10 {
		t.Fatalf("mirror counters %v: the first pulls came from the registry (transfer, from_registry), the second from the store", served)
	}

	// An unpinned image goes to its registry untouched (the mirror answers 404 at once).
	if err := w.reg.Restart(); err != nil {
		t.Fatal(err)
	}
	loose := w.push("loose", 1)
	if out, err := crictl("pull", loose[0]); err != nil {
		t.Fatalf("unpinned pull: %v %s", err, out)
	}
	if used2, _ := store.Usage(context.Background()); used2 != used {
		t.Fatalf("the mirror stored an unpinned image (%d → %d bytes)", used, used2)
	}

	// The set removed: unpin_delay (2 s here) later its pins go, and so do its blobs.
	if err := os.Remove(filepath.Join(w.setsDir, "mirrored.yaml")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		u, _ := store.Usage(context.Background())
		if u == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store still holds %d bytes 30 s after the set was removed", u)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// imagepind stopped (the mirror down): CRI-O goes on to the registry.
	w.stopDaemon()
	if out, err := crictl("rmi", refs[1]); err != nil {
		t.Fatalf("crictl rmi: %v %s", err, out)
	}
	start = time.Now()
	if out, err := crictl("pull", refs[1]); err != nil {
		t.Fatalf("with the mirror down, pulling from the registry failed: %v\n%s", err, out)
	}
	t.Logf("with imagepind stopped, %s pulled from the registry in %s (the mirror refused the connection first)", refs[1], time.Since(start).Round(time.Millisecond))
}

// A disconnected node (upstream.example.invalid/ocp exists only as the administrator's
// digest mirror) with [peers] on: the managed drop-in carries the administrator's mirror
// after the node-local one, the node-local mirror fills through the administrator's, the
// set is Ready, and with the administrator's mirror gone an image removed from CRI-O
// comes back from the node's own store.
func TestNodeLocalMirrorOverTheAdministratorsMirror(t *testing.T) {
	w := newMirrorWorld(t)
	port, err := env.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	w.writeConfig(worldOptions{extra: fmt.Sprintf("[peers]\nenabled = true\nmirror_address = \"127.0.0.1:%d\"\n", port)})
	refs, _ := w.pushUpstreamComponents(2)
	w.startDaemon()
	w.writeSet("ocp.yaml", alphaSet("ocp", refs...))
	w.waitFor("ocp Ready", 60*time.Second, phaseIs("ocp", status.Ready))
	w.requirePinned(refs...)
	data, err := os.ReadFile(filepath.Join(w.crio.RegistriesConfDir(), crio.MirrorDropInName))
	if err != nil {
		t.Fatal(err)
	}
	local := fmt.Sprintf("127.0.0.1:%d/upstream.example.invalid/ocp/component-0", port)
	admin := w.reg.Host + "/ocp/component-0"
	if i, j := strings.Index(string(data), local), strings.Index(string(data), admin); i < 0 || j < i {
		t.Fatalf("the drop-in does not put the node-local mirror (%s) before the administrator's (%s):\n%s", local, admin, data)
	}
	store, err := blobstore.Open(filepath.Join(w.dir, "state", "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	used, _ := store.Usage(context.Background())
	if used < 2*256<<10 {
		t.Fatalf("the store holds %d bytes: the node-local mirror did not fill through the administrator's mirror", used)
	}
	w.reg.Stop()
	crictl := filepath.Join(env.CacheDir(), "crictl")
	if out, err := exec.Command(crictl, "--runtime-endpoint", "unix://"+w.socket(), "rmi", refs[0]).CombinedOutput(); err != nil {
		t.Fatalf("crictl rmi: %v %s", err, out)
	}
	if out, err := exec.Command(crictl, "--runtime-endpoint", "unix://"+w.socket(), "pull", refs[0]).CombinedOutput(); err != nil {
		t.Fatalf("with the administrator's mirror gone, the pinned image did not come back from the node's store: %v\n%s", err, out)
	}
	t.Logf("disconnected layout: the store holds %d bytes; with the administrator's mirror gone, %s came back from it", used, refs[0])
}

// The mirror's store on a full disk (a 320 KiB tmpfs for two 256 KiB layers): the blob
// the store cannot take is served to CRI-O without being stored, and the set is Ready
// with every image right.
func TestNodeLocalMirrorWithAFullStore(t *testing.T) {
	w := newWorld(t)
	storeDir := filepath.Join(w.dir, "small-store")
	os.MkdirAll(storeDir, 0o755)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=320k", "tmpfs", storeDir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", storeDir).Run() })
	port, err := env.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	w.writeConfig(worldOptions{extra: fmt.Sprintf("[peers]\nenabled = true\nmirror_address = \"127.0.0.1:%d\"\nstore_dir = %q\n", port, storeDir)})
	var refs []string
	for i := range 2 {
		img, err := w.reg.PushRandom(context.Background(), fmt.Sprintf("full-%d", i), 1, 256<<10)
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, img.Ref())
	}
	w.startDaemon()
	w.writeSet("full.yaml", alphaSet("full", refs...))
	w.waitFor("full Ready with the store full", 90*time.Second, phaseIs("full", status.Ready))
	w.requirePinned(refs...)
	log, _ := os.ReadFile(filepath.Join(w.dir, "imagepind.log"))
	if !strings.Contains(string(log), "streaming without storing it") {
		t.Fatalf("the store never ran out of room, so nothing was tested:\n%s", tail(string(log), 30))
	}
	t.Logf("the store filled up (%q in imagepind's log); the set is Ready with both images pulled through the mirror", "streaming without storing it")
}
