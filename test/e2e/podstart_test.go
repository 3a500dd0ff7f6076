//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/imagepin/imagepin/kubelet"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
)

// podWorld is a CRI-O node that runs containers, a private registry (htpasswd) whose
// images imagepind pre-loads with the node's pull secret, and a real kubelet (1.36.3; 1.35.4
// in make test-versions) running static pods (hostNetwork, so no CNI) from a manifests directory.
type podWorld struct {
	*world
	priv      *env.Registry
	kdir      string
	kroot     string // the kubelet's --root-dir: short (its sockets are under it)
	manifests string
	kubelet   *env.Kubelet
	// teamA, teamB are pinned; unpinned is in the registry only; pause is CRI-O's.
	teamA, teamB, unpinned, pause string
}

func newPodWorld(t *testing.T, containerd bool) *podWorld {
	t.Helper()
	privDir := t.TempDir()
	priv, err := env.StartAuthRegistry(privDir, "puller", "e2e-s3cret")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(priv.Stop)
	app := filepath.Join(t.TempDir(), "podapp")
	if err := env.GoBuild(app, "github.com/imagepin/imagepin/test/podapp", "-s -w"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	push := func(repo string) string {
		img, err := priv.PushRunnable(ctx, repo, app)
		if err != nil {
			t.Fatal(err)
		}
		return img.Ref()
	}
	p := &podWorld{priv: priv, pause: push("pause"), teamA: push("team-a/app"), teamB: push("team-b/app"), unpinned: push("team-a/unpinned")}
	if containerd {
		p.world = newContainerdWorld(t, func(string) env.ContainerdOptions {
			return env.ContainerdOptions{Insecure: []string{priv.Host}, RunContainers: true, PauseImage: p.pause}
		})
	} else {
		p.world = newWorldWith(t, func(string) env.CRIOOptions {
			return env.CRIOOptions{Insecure: []string{priv.Host}, RunContainers: true, PauseImage: p.pause}
		})
	}
	// The node's pull secret: imagepind pulls with it, as the kubelet would hand it over.
	secret := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, priv.Host, priv.Auth())
	if err := os.WriteFile(filepath.Join(p.dir, "config.json"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	p.kdir = filepath.Join(p.dir, "kubelet")
	p.manifests = filepath.Join(p.kdir, "manifests")
	os.MkdirAll(p.manifests, 0o755)
	if p.kroot, err = os.MkdirTemp("", "kl-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(p.kroot) })
	return p
}

// startKubelet (re)writes the kubelet's config with policy and allowlist and starts it.
func (p *podWorld) startKubelet(policy string, allowlist ...string) {
	p.t.Helper()
	// Each kubelet logs to a fresh file: what a phase asserts is from that phase.
	if p.kubelet != nil {
		os.Rename(p.kubelet.LogFile, p.kubelet.LogFile+".before-"+policy)
	}
	k, err := env.NewKubeletWith(p.kdir, p.socket(), env.KubeletOptions{
		GC:         env.KubeletGC{HighThresholdPercent: 90, LowThresholdPercent: 80, EvictionImagefsAvailable: "1Gi"},
		StaticPods: p.manifests, CredentialPolicy: policy, Allowlist: allowlist, RootDir: p.kroot,
	})
	if err != nil {
		p.t.Fatal(err)
	}
	if err := k.Start(nodeNameForKubelet); err != nil {
		p.t.Fatal(err)
	}
	p.kubelet = k
	p.t.Cleanup(func() {
		if p.t.Failed() {
			p.t.Logf("kubelet log:\n%s", k.LogTail(60))
		}
		k.Stop()
	})
	// The kubelet keeps its pull records (image_manager) once started with the gate on.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(k.RootDir(), "image_manager", "pulled")); err == nil {
			return
		}
		if time.Now().After(deadline) || k.Exited() {
			p.t.Fatalf("the kubelet made no image_manager/pulled (exited: %v):\n%s", k.Exited(), k.LogTail(30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stopPods stops the kubelet and removes every pod, so that the next kubelet starts
// them again (through its image checks).
func (p *podWorld) stopPods() {
	p.t.Helper()
	p.kubelet.Stop()
	for _, f := range []string{"team-a.yaml", "team-b.yaml", "unpinned.yaml"} {
		os.Remove(filepath.Join(p.manifests, f))
	}
	out, err := exec.Command(filepath.Join(env.CacheDir(), "crictl"), "--runtime-endpoint", "unix://"+p.socket(), "rmp", "-fa").CombinedOutput()
	if err != nil {
		p.t.Fatalf("crictl rmp -fa: %v: %s", err, out)
	}
}

// writePods writes the static pods: one per pinned image, none naming a pull secret,
// and the control, whose image is not pinned. (A static pod may not name an
// imagePullSecret from Kubernetes 1.34 on, PreventStaticPodAPIReferences; with that gate
// off, a standalone kubelet 1.35.4 dereferences its nil secret manager and panics in
// getPullSecretsForPod, kubelet_pods.go:1077. Pods with secrets need an API server.)
func (p *podWorld) writePods() {
	p.t.Helper()
	pod := func(file, name, image string) {
		doc := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: default}
spec:
  hostNetwork: true
  containers:
  - name: app
    image: %s
    imagePullPolicy: IfNotPresent
`, name, image)
		if err := os.WriteFile(filepath.Join(p.manifests, file), []byte(doc), 0o644); err != nil {
			p.t.Fatal(err)
		}
	}
	pod("team-a.yaml", "team-a", p.teamA)
	pod("team-b.yaml", "team-b", p.teamB)
	pod("unpinned.yaml", "unpinned", p.unpinned)
}

// running is the set of static pods (by name, without the node suffix) with a running
// container, from CRI-O.
func (p *podWorld) running() map[string]bool {
	p.t.Helper()
	out, err := exec.Command(filepath.Join(env.CacheDir(), "crictl"), "--runtime-endpoint", "unix://"+p.socket(), "ps", "-o", "json").Output()
	if err != nil {
		p.t.Fatalf("crictl ps: %v", err)
	}
	var ps struct {
		Containers []struct {
			State  string            `json:"state"`
			Labels map[string]string `json:"labels"`
		} `json:"containers"`
	}
	if err := json.Unmarshal(out, &ps); err != nil {
		p.t.Fatalf("crictl ps: %v: %s", err, out)
	}
	got := map[string]bool{}
	for _, c := range ps.Containers {
		if c.State == "CONTAINER_RUNNING" {
			got[strings.TrimSuffix(c.Labels["io.kubernetes.pod.name"], "-"+nodeNameForKubelet)] = true
		}
	}
	return got
}

// expectPods waits until exactly the pods in want run; the others must not run for
// `hold` after that (a pod that needs the registry never starts: it is gone).
func (p *podWorld) expectPods(want []string, hold time.Duration) {
	p.t.Helper()
	wanted := map[string]bool{}
	for _, w := range want {
		wanted[w] = true
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := p.running()
		ok := true
		for w := range wanted {
			ok = ok && got[w]
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("running %v, want %v", got, want)
		}
		time.Sleep(250 * time.Millisecond)
	}
	end := time.Now().Add(hold)
	for time.Now().Before(end) {
		for name := range p.running() {
			if !wanted[name] {
				p.t.Fatalf("pod %s runs with the registry gone; only %v should", name, want)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// registryCondition waits until the set's RegistryIndependent condition has status
// want and names policy.
func (p *podWorld) registryCondition(want, policy string) status.Condition {
	p.t.Helper()
	n := p.waitFor("RegistryIndependent "+want+" under "+policy, 60*time.Second, func(n status.Node) bool {
		s := n.Set("apps")
		if s == nil || s.Phase != status.Ready {
			return false
		}
		c := s.Condition(status.ConditionRegistryIndependent)
		return c != nil && c.Status == want && strings.Contains(c.Message, " "+policy+":")
	})
	c := *n.Set("apps").Condition(status.ConditionRegistryIndependent)
	p.t.Logf("imagepind's RegistryIndependent: %s/%s: %s", c.Status, c.Reason, c.Message)
	return c
}

// checkRegistryGone runs imagepinctl check --registry-gone on the set's file: what an
// administrator runs before cutting the registry off.
func (p *podWorld) checkRegistryGone(wantExit int, contains string) {
	p.t.Helper()
	out, err := exec.Command(filepath.Join(binDir, "imagepinctl"), "check", "--registry-gone", "--config", p.config, filepath.Join(p.setsDir, "apps.yaml")).CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		p.t.Fatal(err)
	}
	if code != wantExit || !strings.Contains(string(out), contains) {
		p.t.Fatalf("imagepinctl check --registry-gone: exit %d, want %d with %q:\n%s", code, wantExit, contains, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "registry gone") || strings.Contains(l, "need the registry") {
			p.t.Logf("imagepinctl check --registry-gone (exit %d): %s", code, strings.TrimSpace(l))
		}
	}
}

// logKubelet puts the kubelet's own lines about the pods' images in the test's log:
// the first saying the image was present (or is being pulled), and the first failure.
func (p *podWorld) logKubelet(phase string, images ...string) {
	for _, img := range images {
		for _, kinds := range [][]string{{"already present", "Pulling image"}, {"Failed to pull image", "ErrImagePull"}} {
			for _, l := range p.kubelet.Lines(img) {
				if strings.Contains(l, kinds[0]) || strings.Contains(l, kinds[1]) {
					p.t.Logf("%s kubelet: %s", phase, l)
					break
				}
			}
		}
	}
}

// The promise where it matters: with imagepind's set pre-loaded from a private registry
// and the registry then gone, a real kubelet starts pods from the pinned images,
// and imagepind said beforehand which kubelet policy would stop them.
func TestPodsStartFromPinnedImagesWithTheRegistryGone(t *testing.T) {
	podStart(t, newPodWorld(t, false))
}

// The same on containerd: its runc shim runs the pods, with a real sandbox (pause)
// container, which CRI-O does without.
func TestContainerdPodsStartFromPinnedImagesWithTheRegistryGone(t *testing.T) {
	podStart(t, newPodWorld(t, true))
}

func podStart(t *testing.T, p *podWorld) {
	p.writeConfig(worldOptions{extra: fmt.Sprintf("[kubelet]\nconfig_dir = \"\"\nroot_dir = %q\nbinary = %q\n", p.kroot, filepath.Join(env.CacheDir(), "kubelet")),
		kubeletConfig: filepath.Join(p.kdir, "kubelet.yaml")})

	// The kubelet runs first, with its default policy (NeverVerifyPreloadedImages).
	p.startKubelet("")
	p.startDaemon()
	p.writeSet("apps.yaml", alphaSet("apps", p.pause, p.teamA, p.teamB))
	p.waitFor("apps Ready", 120*time.Second, phaseIs("apps", status.Ready))
	p.requirePinned(p.pause, p.teamA, p.teamB)
	// The node's own pods start; a node joining would need the registry: this one shares
	// no blob ([peers] off), and no aggregator counts the holders. So Unknown, not True.
	if c := p.registryCondition(status.Unknown, kubelet.NeverVerifyPreloadedImages); c.Reason != status.ReasonBlobHoldersUnknown ||
		!strings.Contains(c.Message, "no aggregator counts them ([report] aggregator is not set), and this node shares none ([peers] is off): a node joining, or replacing this one, would need the registry") ||
		!strings.Contains(c.Message, "this node's own pods start from its 3 images with the registry gone (imagePullCredentialsVerificationPolicy NeverVerifyPreloadedImages: pods start from these 3 images without the registry)") {
		t.Fatalf("default policy: %+v", c)
	}
	p.checkRegistryGone(1, "registry gone: NOT READY (cannot be told: BlobHoldersUnknown)\n      whether every blob of the images is held by 2 nodes cannot be told: no aggregator to count them")

	// The registry is gone.
	p.priv.Stop()
	p.writePods()
	p.expectPods([]string{"team-a", "team-b"}, 15*time.Second)
	if lines := p.kubelet.Lines(p.teamA, "already present on machine and can be accessed by the pod"); len(lines) == 0 {
		t.Fatalf("no kubelet line says %s was present and accessible:\n%s", p.teamA, p.kubelet.LogTail(40))
	}
	if lines := p.kubelet.Lines(p.unpinned, "Pulling image"); len(lines) == 0 {
		t.Fatalf("the control pod's image was never pulled for: the control proves nothing\n%s", p.kubelet.LogTail(40))
	}
	p.logKubelet("NeverVerifyPreloadedImages:", p.teamA, p.teamB, p.unpinned)
	// imagepind pulled through CRI: the kubelet made no pull record, so the images stay
	// pre-loaded for it.
	if recs, err := kubelet.ReadPullRecords(p.kubelet.RootDir()); err != nil || len(recs.Pulled) != 0 {
		t.Fatalf("pull records after the pod starts: %+v %v", recs, err)
	}

	// AlwaysVerify: imagepind says so before any pod starts, and the kubelet indeed
	// will not start them with the registry gone.
	p.stopPods()
	p.startKubelet(kubelet.AlwaysVerify)
	c := p.registryCondition(status.False, kubelet.AlwaysVerify)
	if c.Reason != status.ReasonCredentialVerification || !strings.Contains(c.Message, "AlwaysVerify: 3 of 3 images need the registry") {
		t.Fatalf("AlwaysVerify predicted: %+v", c)
	}
	p.checkRegistryGone(1, "AlwaysVerify: 3 of 3 images need the registry")
	p.writePods()
	p.expectPods(nil, 20*time.Second)
	if lines := p.kubelet.Lines(p.teamA, "Pulling image"); len(lines) == 0 {
		t.Fatalf("AlwaysVerify: the kubelet did not go to the registry for %s:\n%s", p.teamA, p.kubelet.LogTail(40))
	}
	p.logKubelet("AlwaysVerify:", p.teamA, p.teamB)

	// NeverVerifyAllowlistedImages covering team-a: the prediction names exactly the
	// others (team-b's image and the pause image), and only team-a's pod starts.
	p.stopPods()
	p.startKubelet(kubelet.NeverVerifyAllowlistedImages, p.priv.Host+"/team-a/*")
	c = p.registryCondition(status.False, kubelet.NeverVerifyAllowlistedImages)
	if !strings.Contains(c.Message, "2 of 3 images need the registry") || !strings.Contains(c.Message, p.teamB) ||
		!strings.Contains(c.Message, p.pause) || strings.Contains(c.Message, p.teamA) {
		t.Fatalf("allowlist predicted: %+v", c)
	}
	p.writePods()
	p.expectPods([]string{"team-a"}, 15*time.Second)
	p.logKubelet("NeverVerifyAllowlistedImages:", p.teamA, p.teamB)

	// An exact entry, team-b's name without its digest: a kubelet of 1.36 or later cuts
	// the tag and digest off the pod's image before comparing, so team-b's pod starts; an
	// earlier one compares the image as written, so none does. imagepind reads the
	// kubelet's version from its binary ([kubelet] binary) and says which beforehand.
	p.stopPods()
	p.startKubelet(kubelet.NeverVerifyAllowlistedImages, p.priv.Host+"/team-b/app")
	version := kubeletVersion(t)
	want, starts := "3 of 3 images need the registry", []string(nil)
	if version.Minor >= 36 {
		want, starts = "2 of 3 images need the registry", []string{"team-b"}
	}
	// The condition of the step before (team-a allowlisted) also says "2 of 3": only one
	// naming team-a's image is imagepind's answer to this kubelet's configuration.
	n := p.waitFor("the exact allowlist entry predicted for kubelet "+version.Text, 60*time.Second, func(n status.Node) bool {
		c := n.Set("apps").Condition(status.ConditionRegistryIndependent)
		return c != nil && c.Status == status.False && strings.Contains(c.Message, want) && strings.Contains(c.Message, p.teamA)
	})
	c = *n.Set("apps").Condition(status.ConditionRegistryIndependent)
	t.Logf("kubelet %s, exact allowlist entry: imagepind's RegistryIndependent: %s/%s: %s", version.Text, c.Status, c.Reason, c.Message)
	if (version.Minor >= 36 && strings.Contains(c.Message, p.teamB)) || !strings.Contains(c.Message, p.teamA) {
		t.Fatalf("exact allowlist entry under kubelet %s: %+v", version.Text, c)
	}
	p.writePods()
	p.expectPods(starts, 15*time.Second)
	p.logKubelet("NeverVerifyAllowlistedImages, exact entry:", p.teamA, p.teamB)
}

// kubeletVersion is the version of the cache's kubelet, the one the tests run.
func kubeletVersion(t *testing.T) kubelet.Version {
	t.Helper()
	line, err := env.VersionLine("kubelet")
	if err != nil {
		t.Fatal(err)
	}
	v, err := kubelet.ParseVersion(line)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
