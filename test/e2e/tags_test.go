//go:build e2e

package e2e

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepin/imagepin/containerd"
	"github.com/imagepin/imagepin/crio"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
)

// tagsHome gives the CRI-O started after it a home of the test's own: containers/image
// reads $HOME/.config/containers/certs.d before /etc/containers/certs.d, so the test
// points that at the certs.d imagepind writes into ([disk] certs_dir, linkCertsDir) and
// leaves the machine's /etc alone. The Go toolchain keeps its caches.
func tagsHome(t *testing.T) string {
	t.Helper()
	for _, k := range []string{"GOCACHE", "GOMODCACHE", "GOPATH"} {
		out, err := exec.Command("go", "env", k).Output()
		if err != nil {
			t.Fatal(err)
		}
		t.Setenv(k, strings.TrimSpace(string(out)))
	}
	home := t.TempDir()
	t.Setenv("HOME", home)
	return home
}

func linkCertsDir(t *testing.T, home, certsDir string) {
	t.Helper()
	os.MkdirAll(certsDir, 0o755)
	os.MkdirAll(filepath.Join(home, ".config", "containers"), 0o755)
	if err := os.Symlink(certsDir, filepath.Join(home, ".config", "containers", "certs.d")); err != nil {
		t.Fatal(err)
	}
}

// tagInRegistry makes repo:tag point at digestRef's manifest in reg.
func tagInRegistry(t *testing.T, reg *env.Registry, digestRef, tag string) {
	t.Helper()
	var auth remote.Option = remote.WithAuth(authn.Anonymous)
	if reg.User != "" {
		auth = remote.WithAuth(&authn.Basic{Username: reg.User, Password: reg.Password})
	}
	ref, err := name.ParseReference(digestRef, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(ref, auth)
	if err != nil {
		t.Fatal(err)
	}
	tg, err := name.NewTag(ref.Context().String()+":"+tag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Tag(tg, desc, auth); err != nil {
		t.Fatal(err)
	}
}

func repoOf(digestRef string) string { r, _, _ := strings.Cut(digestRef, "@"); return r }

// crictl runs crictl against the world's runtime.
func (w *world) crictl(args ...string) (string, error) {
	out, err := exec.Command(filepath.Join(env.CacheDir(), "crictl"), append([]string{"--runtime-endpoint", "unix://" + w.socket()}, args...)...).CombinedOutput()
	return string(out), err
}

// writePod writes one static pod running image (IfNotPresent, no pull secret).
func (p *podWorld) writePod(file, podName, image string) {
	p.t.Helper()
	doc := fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata: {name: %s, namespace: default}\nspec:\n  hostNetwork: true\n  containers:\n  - name: app\n    image: %s\n    imagePullPolicy: IfNotPresent\n", podName, image)
	if err := os.WriteFile(filepath.Join(p.manifests, file), []byte(doc), 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// tlsImpostor serves im (an impostor's registry) over TLS with a certificate of its own
// on addr, taking it as soon as it is free: the strongest stand-in a local process can
// be for the mirror's tag endpoint.
func tlsImpostor(t *testing.T, im *impostor, addr string) *httptest.Server {
	t.Helper()
	var l net.Listener
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for {
		if l, err = net.Listen("tcp", addr); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the impostor cannot bind the tag endpoint's address %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	srv := httptest.NewUnstartedServer(im)
	srv.Listener.Close()
	srv.Listener = l
	srv.TLS = &tls.Config{}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// Tags on CRI-O: a set pins src.example.invalid/team-t/app:v1@<digest> (a source that
// does not resolve, reached through the administrator's registries.conf location, as
// in a disconnected cluster); imagepind pre-loads the tag through the node-local
// mirror's TLS endpoint (CRI-O records it as it pulls it); another tag of the same
// repository goes to the registry; with the registries gone a real kubelet starts a pod
// naming the tag and one naming a digest; with imagepind stopped, nothing on the tag
// endpoint's address is believed: not a refused connection, not an impostor with a
// certificate of its own bound to it.
//
// The source is not on loopback on purpose: CRI-O before 1.35 verifies no TLS at all on a
// pull whose registry it holds insecure (127.0.0.0/8 always), so imagepind gives such
// repositories no tag endpoint there (crio.VerifiesTLS).
func TestTagsPinnedOnCRIO(t *testing.T) {
	home := tagsHome(t)
	p := newPodWorld(t, false)
	linkCertsDir(t, home, p.crio.CertsDir())
	const source = "src.example.invalid"
	admin := fmt.Sprintf("[[registry]]\nprefix = %q\nlocation = %q\ninsecure = true\n", source, p.reg.Host)
	if err := os.WriteFile(filepath.Join(p.crio.RegistriesConfDir(), "50-source.conf"), []byte(admin), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(p.crio.PID(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "CRI-O reads the source's location", 20*time.Second, func() bool { return p.crio.LogContains(source) })

	app := filepath.Join(t.TempDir(), "podapp")
	if err := env.GoBuild(app, "github.com/imagepin/imagepin/test/podapp", "-s -w"); err != nil {
		t.Fatal(err)
	}
	img, err := p.reg.PushRunnable(t.Context(), "team-t/app", app)
	if err != nil {
		t.Fatal(err)
	}
	// The registry's v1 has moved on from the image the set pins: the node must still
	// get the pinned one (from the mirror), and say the tag moved.
	decoy, err := p.reg.PushRandom(t.Context(), "team-t/app", 1, 16<<10)
	if err != nil {
		t.Fatal(err)
	}
	tagInRegistry(t, p.reg, decoy.Ref(), "v1")
	repo := source + "/team-t/app"
	pinnedRef, tagged := repo+"@"+img.Digest, repo+":v1"

	mirrorAddr, tagAddr := fmt.Sprintf("127.0.0.1:%d", mustFreePort(t)), fmt.Sprintf("127.0.0.1:%d", mustFreePort(t))
	p.writeConfig(worldOptions{kubeletConfig: filepath.Join(p.kdir, "kubelet.yaml"), metrics: true,
		extra: fmt.Sprintf("[kubelet]\nconfig_dir = \"\"\nroot_dir = %q\n[peers]\nenabled = true\nmirror_address = %q\ntag_address = %q\n", p.kroot, mirrorAddr, tagAddr)})
	p.startKubelet("")
	start := time.Now()
	p.startDaemon()
	p.writeSet("apps.yaml", alphaSet("apps", p.pause, repo+":v1@"+img.Digest, p.teamB))
	p.waitFor("apps Ready", 120*time.Second, phaseIs("apps", status.Ready))
	p.requirePinned(p.pause, pinnedRef, p.teamB)

	// The tag pre-loaded as the pinned digest's image, and pinned with it.
	want := p.image(pinnedRef).ID
	waitUntil(t, "CRI-O holds "+tagged, 60*time.Second, func() bool { i := p.image(tagged); return i.Present && i.ID == want })
	if i := p.image(tagged); !i.Pinned {
		t.Fatalf("%s is not pinned: %+v", tagged, i)
	}
	t.Logf("%s pre-loaded as %s %s after imagepind started", tagged, pinnedRef, time.Since(start).Round(time.Millisecond))
	if !p.crio.LogContains(`Trying to access \"` + tagAddr + "/" + tagged + `\"`) {
		t.Fatalf("CRI-O never asked the tag endpoint %s:\n%s", tagAddr, p.crio.LogTail(30))
	}
	if _, err := os.Stat(filepath.Join(p.crio.CertsDir(), tagAddr, "ca.crt")); err != nil {
		t.Fatalf("the tag endpoint's CA is not in certs.d: %v", err)
	}
	caKey, err := os.Stat(filepath.Join(p.dir, "state", "tag-mirror-ca.key"))
	if err != nil || caKey.Mode().Perm() != 0o600 {
		t.Fatalf("the CA's key: %v %v, want mode 0600", caKey, err)
	}
	// CRI-O before 1.35 verifies no endpoint of a pull from a loopback registry: those
	// repositories (pause, team-b) get no tag endpoint. From 1.35 it verifies each
	// endpoint as registries.conf says of it: all three get it.
	dropIn, _ := os.ReadFile(filepath.Join(p.crio.RegistriesConfDir(), crio.MirrorDropInName))
	wantTagEndpoints := 1
	if crioSupport(t).TLSPerEndpoint {
		wantTagEndpoints = 3
	}
	if n := strings.Count(string(dropIn), `pull-from-mirror = "tag-only"`); n != wantTagEndpoints {
		t.Fatalf("the drop-in gives the tag endpoint to %d repositories, want %d:\n%s", n, wantTagEndpoints, dropIn)
	}

	// The move reported while the registry answers: status, imagepinctl, metric.
	n := p.waitFor("the moved tag reported", 60*time.Second, func(n status.Node) bool {
		return n.Tags != nil && len(n.Tags.Moved) == 1 && n.Tags.Held == 1
	})
	if m := n.Tags.Moved[0]; m.Tag != tagged || m.Pinned != img.Digest || m.Registry != decoy.Digest {
		t.Fatalf("moved tag %+v, want %s pinned at %s, %s in the registry", m, tagged, img.Digest, decoy.Digest)
	}
	out, err := exec.Command(filepath.Join(binDir, "imagepinctl"), "status", "--config", p.config).CombinedOutput()
	if !strings.Contains(string(out), "moved: "+tagged+" is "+decoy.Digest) {
		t.Fatalf("imagepinctl status (%v) does not name the moved tag:\n%s", err, out)
	}
	if metrics := scrape(t, p.world); !strings.Contains(metrics, `imagepin_tags{state="moved"} 1`) || !strings.Contains(metrics, `imagepin_tags{state="held"} 1`) {
		t.Fatalf("metrics do not count the moved tag:\n%s", grepLines(metrics, "imagepin_tags"))
	}
	t.Logf("moved tag reported: %s pinned %s, registry %s", tagged, img.Digest, decoy.Digest)

	// Another tag of the same repository goes to the registry: latest moves to a new
	// image there, and a pull of it gives that image, not the pinned one.
	moved, err := p.reg.PushRandom(t.Context(), "team-t/app", 1, 32<<10)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := p.crictl("pull", repo+":latest"); err != nil {
		t.Fatalf("pull of an unpinned tag: %v\n%s", err, out)
	}
	movedRef := repo + "@" + moved.Digest
	if got, reg := p.image(repo+":latest"), p.image(movedRef); !reg.Present || got.ID != reg.ID || got.ID == want {
		t.Fatalf("%s:latest is %s, want the registry's %s (%s), not the pinned %s", repo, got.ID, movedRef, reg.ID, want)
	}
	if !p.crio.LogContains(`Trying to access \"` + tagAddr + "/" + repo + `:latest\"`) {
		t.Fatalf("CRI-O did not ask the tag endpoint first for the unpinned tag:\n%s", p.crio.LogTail(30))
	}
	if i := p.image(tagged); i.ID != want {
		t.Fatalf("%s moved to %s with another tag's pull", tagged, i.ID)
	}

	// The registries gone: pods naming the tag and a digest start.
	p.priv.Stop()
	p.reg.Stop()
	p.writePod("by-tag.yaml", "by-tag", tagged)
	p.writePod("by-digest.yaml", "by-digest", p.teamB)
	p.expectPods([]string{"by-tag", "by-digest"}, 5*time.Second)
	if lines := p.kubelet.Lines(tagged, "already present on machine"); len(lines) == 0 {
		t.Fatalf("no kubelet line says %s was present:\n%s", tagged, p.kubelet.LogTail(40))
	}
	p.logKubelet("registry gone:", tagged, p.teamB)
	// imagepinctl said so: the tag held as the pinned digest.
	// (Not ready for the cluster: without an aggregator no one counts the blobs' holders,
	// the only obstacle; a tag not held would be a sure TagsNotHeld before it.)
	p.checkRegistryGone(1, "registry gone: NOT READY (cannot be told: BlobHoldersUnknown)\n      whether every blob of the images is held by 2 nodes cannot be told: no aggregator to count them")

	// imagepind stopped: the tag endpoint's address refuses; a pull of the tag goes on
	// to the registry (gone: it fails) and the node's tag stays the pinned image.
	p.stopDaemon()
	if out, err := p.crictl("pull", tagged); err == nil {
		t.Fatalf("with imagepind stopped and the registry gone, a pull of %s succeeded: something answered the tag:\n%s", tagged, out)
	}
	if i := p.image(tagged); i.ID != want {
		t.Fatalf("%s is %s after a failed pull, want %s", tagged, i.ID, want)
	}

	// An impostor binds the tag endpoint's address, with a certificate of its own,
	// serving its own image for every tag. The registry is back, its v1 moved. CRI-O
	// cannot complete TLS with the impostor and takes the tag from the registry.
	if err := p.reg.Restart(); err != nil {
		t.Fatal(err)
	}
	fake := p.push("impostor", 1)[0]
	im := startImpostor(t, fmt.Sprintf("127.0.0.1:%d", mustFreePort(t)), fake)
	tlsImpostor(t, im, tagAddr)
	// First with the registry gone: the pull fails rather than take the impostor's image.
	p.reg.Stop()
	if out, err := p.crictl("pull", tagged); err == nil {
		t.Fatalf("with an impostor on the tag endpoint and the registry gone, a pull of %s succeeded:\n%s", tagged, out)
	}
	if i := p.image(tagged); i.ID != want {
		t.Fatalf("%s is %s with an impostor on the tag endpoint, want the pinned %s", tagged, i.ID, want)
	}
	if err := p.reg.Restart(); err != nil {
		t.Fatal(err)
	}
	tagInRegistry(t, p.reg, p.reg.Host+"/team-t/app@"+moved.Digest, "v1")
	if out, err := p.crictl("pull", tagged); err != nil {
		t.Fatalf("pull with an impostor on the tag endpoint and the registry back: %v\n%s", err, out)
	}
	if got, reg := p.image(tagged), p.image(movedRef); got.ID != reg.ID {
		t.Fatalf("%s is %s, want the registry's %s (the pinned one is %s)\n%s", tagged, got.ID, reg.ID, want, p.crio.LogTail(40))
	}
	if seen, reqs := im.counts(); seen.TagManifests+seen.DigestManifests+seen.Blobs+seen.Other != 0 {
		t.Fatalf("CRI-O sent requests to the impostor: %v", reqs)
	}
	t.Logf("with an impostor on %s, CRI-O took %s from the registry (no request reached the impostor)", tagAddr, tagged)

	// The node's tag now names the registry's image, not the pinned digest: a pod naming
	// it would not start from the pinned image with the registry gone, and imagepinctl
	// says so in imagepind's words (registrygone.Decide).
	p.checkRegistryGone(1, "registry gone: NOT READY (TagsNotHeld)\n      1 of 1 pinned tags are not held by the runtime as their pinned digests: "+tagged+" (pods naming them would need the registry)\n")
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func mustFreePort(t *testing.T) int {
	t.Helper()
	port, err := env.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// Tags on containerd: an image record repo:tag with the pinned digest's target,
// pinned; deleted behind imagepind's back, it comes back at once; with the registry gone a real
// kubelet starts a pod naming the tag and one naming a digest.
func TestTagsPinnedOnContainerd(t *testing.T) {
	p := newPodWorld(t, true)
	p.writeConfig(worldOptions{kubeletConfig: filepath.Join(p.kdir, "kubelet.yaml"),
		extra: fmt.Sprintf("[kubelet]\nconfig_dir = \"\"\nroot_dir = %q\n", p.kroot)})
	repo := repoOf(p.teamA)
	tagged := repo + ":v1"
	p.startKubelet("")
	p.startDaemon()
	p.writeSet("apps.yaml", alphaSet("apps", p.pause, repo+":v1@"+strings.TrimPrefix(p.teamA, repo+"@"), p.teamB))
	p.waitFor("apps Ready", 120*time.Second, phaseIs("apps", status.Ready))
	digest := strings.TrimPrefix(p.teamA, repo+"@")
	waitUntil(t, "the record "+tagged, 60*time.Second, func() bool { return recordTarget(t, p.socket(), tagged) == digest })
	if !p.labelled(tagged) {
		t.Fatalf("the record %s is not pinned", tagged)
	}
	if img := p.image(tagged); !img.Present || !img.Pinned || img.ID != p.image(p.teamA).ID {
		t.Fatalf("CRI sees %s as %+v, want the pinned %s", tagged, img, p.image(p.teamA).ID)
	}
	images := p.containerdImages()
	if err := images.Delete(t.Context(), tagged); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	// Within 10 s: at its image event, not the 20 s look.
	waitUntil(t, "the record "+tagged+" back", 10*time.Second, func() bool { return recordTarget(t, p.socket(), tagged) == digest })
	t.Logf("the record %s deleted behind imagepind's back was back in %s", tagged, time.Since(deleted).Round(time.Millisecond))
	if r, err := images.Get(t.Context(), tagged); err != nil || r.Labels[containerd.TagLabel] != p.teamA {
		t.Fatalf("record %s: %+v %v", tagged, r, err)
	}

	p.priv.Stop()
	p.writePod("by-tag.yaml", "by-tag", tagged)
	p.writePod("by-digest.yaml", "by-digest", p.teamB)
	p.expectPods([]string{"by-tag", "by-digest"}, 5*time.Second)
	p.logKubelet("registry gone:", tagged, p.teamB)
	// imagepinctl said so: the tag held as the pinned digest.
	// (Not ready for the cluster: without an aggregator no one counts the blobs' holders,
	// the only obstacle; a tag not held would be a sure TagsNotHeld before it.)
	p.checkRegistryGone(1, "registry gone: NOT READY (cannot be told: BlobHoldersUnknown)\n      whether every blob of the images is held by 2 nodes cannot be told: no aggregator to count them")

	// The set without the tag: the record imagepind made goes.
	p.writeSet("apps.yaml", alphaSet("apps", p.pause, p.teamA, p.teamB))
	waitUntil(t, "the record "+tagged+" gone", 60*time.Second, func() bool { return recordTarget(t, p.socket(), tagged) == "" })
}

// crioSupport is what the cache's CRI-O, the one the tests run, does.
func crioSupport(t *testing.T) crio.Support {
	t.Helper()
	v, err := env.RuntimeVersion("crio")
	if err != nil {
		t.Fatal(err)
	}
	sup, err := crio.SupportOf(v)
	if err != nil {
		t.Fatal(err)
	}
	return sup
}
