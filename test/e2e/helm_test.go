//go:build e2e

package e2e

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/imagepin/imagepin/nodegiveback"
	"github.com/imagepin/imagepin/packaging/image"
	"github.com/imagepin/imagepin/state"
	"github.com/imagepin/imagepin/test/env"
)

// helmCluster is the whole cluster of TestHelmInstallUpgradeUninstall: the nodes in mount
// namespaces of their own laid out as real nodes are (env.ClusterOptions.NodeNamespaces),
// imagepind installed by the chart from an image in the test registry.
type helmCluster struct {
	t   *testing.T
	dir string
	c   *env.Cluster
	// sys serves imagepin's image (and the pause image), app the application's: the
	// registry the test cuts.
	sys, app *env.Registry
	// images are the two builds of imagepin's image (repo@sha256:…), install's and upgrade's.
	images [2]string
	appV1  string
	failed bool
}

const (
	helmNamespace = "imagepin"
	helmRelease   = "imagepin"
	// runtimeLabel tells the CRI-O nodes from the containerd one.
	runtimeLabel = "e2e.imagepin.io/runtime"
)

// TestHelmInstallUpgradeUninstall: helm install puts imagepind on every CRI-O node of a
// real multi-node cluster from imagepin's image in a registry, as the chart's DaemonSet;
// a pinned set goes Ready on every node; with the registry gone a Deployment rolls out;
// helm upgrade to another build of the image pulls nothing and keeps every set Ready;
// helm uninstall gives every node back: each node's runtime configuration is what it was
// before the install, byte for byte and mode for mode (the diff is printed).
func TestHelmInstallUpgradeUninstall(t *testing.T) {
	for _, b := range []string{"helm", "kubectl", "kubelet"} {
		if _, err := os.Stat(filepath.Join(env.CacheDir(), b)); err != nil {
			t.Fatalf("%s/%s missing: run make deps", env.CacheDir(), b)
		}
	}
	start := time.Now()
	h := newHelmCluster(t)
	h.step("snapshot", h.snapshotAll("before"))
	h.step("install", h.install)
	h.step("pin", h.pin)
	h.step("snapshot while pinned", h.snapshotPinned)
	h.step("registry gone, roll out", h.rollout)
	h.step("upgrade", h.upgrade)
	h.step("uninstall", h.uninstall)
	t.Logf("whole test: %s", time.Since(start).Round(time.Second))
}

func (h *helmCluster) step(name string, f func(t *testing.T)) {
	h.t.Run(name, func(t *testing.T) {
		if h.failed {
			t.Skip("an earlier step failed")
		}
		start := time.Now()
		defer func() {
			h.failed = h.failed || t.Failed()
			t.Logf("%s: %s", name, time.Since(start).Round(100*time.Millisecond))
		}()
		f(t)
	})
}

func newHelmCluster(t *testing.T) *helmCluster {
	t.Helper()
	dir := t.TempDir()
	ctx := t.Context()
	h := &helmCluster{t: t, dir: dir}
	var err error
	for _, r := range []struct {
		reg  **env.Registry
		name string
	}{{&h.sys, "sys-registry"}, {&h.app, "app-registry"}} {
		os.MkdirAll(filepath.Join(dir, r.name), 0o755)
		if *r.reg, err = env.StartRegistry(filepath.Join(dir, r.name)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup((*r.reg).Stop)
	}
	start := time.Now()
	h.buildImages(t)
	t.Logf("imagepin's image built twice and pushed in %s: %s, %s", time.Since(start).Round(100*time.Millisecond), h.images[0], h.images[1])

	app := filepath.Join(dir, "podapp")
	if err := env.GoBuild(app, "github.com/imagepin/imagepin/test/podapp", "-s -w"); err != nil {
		t.Fatal(err)
	}
	pause, err := h.sys.PushRunnableWith(ctx, "pause", app)
	if err != nil {
		t.Fatal(err)
	}
	layer, err := env.RandomLayer(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	v1, err := h.app.PushRunnableWith(ctx, "shop/app", app, layer)
	if err != nil {
		t.Fatal(err)
	}
	h.appV1 = v1.Repo + "@" + v1.Digest

	start = time.Now()
	c, err := env.StartCluster(ctx, filepath.Join(dir, "cluster"), env.ClusterOptions{
		Nodes: 3, ContainerdNodes: []int{2}, Bin: binDir, Packaging: filepath.Join("..", "..", "packaging", "aggregator"),
		Insecure: []string{h.sys.Host, h.app.Host}, PauseImage: pause.Repo + "@" + pause.Digest,
		PullSecret: []byte(`{"auths": {}}`), NodeNamespaces: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	h.c = c
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("cluster logs:\n%s", c.LogTails(25))
			// The API server cannot reach the kubelets by name: the runtimes' logs.
			for _, n := range h.crioNodes() {
				ids, _ := n.Crictl(context.Background(), "ps", "-a", "-q", "--name", "imagepind")
				for _, id := range strings.Fields(string(ids)) {
					out, _ := exec.Command(filepath.Join(env.CacheDir(), "crictl"), "--runtime-endpoint", "unix://"+n.Socket(), "logs", "--tail", "40", id).CombinedOutput()
					t.Logf("%s imagepind container %s:\n%s", n.Name, id, out)
				}
			}
		}
		c.Stop()
	})
	t.Logf("cluster up in %s: 3 nodes in mount namespaces of their own (node-0, node-1 on CRI-O laid out as kubeadm's, node-2 on containerd as k3s's), no imagepind yet",
		time.Since(start).Round(100*time.Millisecond))
	for _, n := range c.Nodes {
		h.kubectl(t, "label", "node", n.Name, runtimeLabel+"="+map[bool]string{true: "containerd", false: "crio"}[n.Containerd != nil])
	}
	return h
}

// buildImages builds imagepin's image (linux/amd64: the nodes') twice, as two releases
// would be (the same binaries, another version label: another digest), with the builder
// make image uses, and pushes both to the sys registry.
func (h *helmCluster) buildImages(t *testing.T) {
	bins := filepath.Join(h.dir, "image-bin", "linux-amd64")
	names := []string{"imagepind", "imagepinctl", "imagepin-aggregator"}
	args := []string{"build", "-trimpath", "-buildvcs=false", "-o", bins + "/"}
	for _, n := range names {
		args = append(args, "github.com/imagepin/imagepin/cmd/"+n)
	}
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for i, version := range []string{"e2e-1", "e2e-2"} {
		layout := filepath.Join(h.dir, "image-"+version)
		if _, err := image.Write(layout, image.Config{
			Platforms:  []image.Platform{{Arch: "amd64", Dir: bins}},
			Binaries:   names,
			Entrypoint: []string{"/usr/bin/imagepind"},
			Created:    time.Unix(0, 0).UTC(),
			Labels:     map[string]string{"org.opencontainers.image.version": version},
		}); err != nil {
			t.Fatal(err)
		}
		ref, err := image.Push(layout, h.sys.Host+"/imagepin/imagepin:"+version)
		if err != nil {
			t.Fatal(err)
		}
		h.images[i] = ref.String()
	}
	if h.images[0] == h.images[1] {
		t.Fatalf("two builds of other versions have one digest: %s", h.images[0])
	}
}

func (h *helmCluster) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := h.kubectlErr(args...)
	if err != nil {
		t.Fatalf("%s: %v\n%s", env.KubectlCommand(args...), err, out)
	}
	return out
}

func (h *helmCluster) kubectlErr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := h.c.Kubectl(ctx, args...)
	return string(out), err
}

// helm runs the real helm as the cluster's admin, its own files under the test's dir.
func (h *helmCluster) helm(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(env.CacheDir(), "helm"), append([]string{"--kubeconfig", h.c.Admin}, args...)...)
	home := filepath.Join(h.dir, "helm-home")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("$ helm %s (%s)\n%s", strings.Join(args, " "), time.Since(start).Round(100*time.Millisecond), out)
	if err != nil {
		t.Fatalf("helm %s: %v", args[0], err)
	}
	return string(out)
}

// values are the chart's values for this cluster, with imagepin's image build i.
//   - aggregator.enabled false, report.*: the cluster runs its own aggregators (processes,
//     as env.Cluster starts them): pods here have no network but the host's and no
//     Services (no kube-proxy, no DNS), so the chart's aggregator Deployment could not be
//     reached. imagepind reports to the cluster's, whose CA the nodes hold in the kubelet's
//     pki directory.
//   - crd.install false: the cluster made the CRD as it was shipped before the chart.
//   - peers.enabled false: every node shares the host's network here, and the mirror
//     listens on one loopback port on every node.
//   - imagepind.crioReload signal: no systemd on these nodes.
//   - imagepind.nodeSelector: the CRI-O nodes (the chart has one preset per release; the
//     containerd node would be a second release).
//   - imagepind.priorityClassName "": system-node-critical makes the kubelet give the
//     container an oom_score_adj of -997, which this machine's processes may not set
//     (they lack CAP_SYS_RESOURCE).
//   - uninstall.enabled false: the hook's Job talks to the API through the kubernetes
//     Service, which has no proxy here: the test runs its command itself.
//   - paths.imageFs: each node's CRI-O keeps its images under the test's directory
//     (<cluster>/nN/crio/root), not /var/lib/containers/storage: the directory of all
//     nodes, read-only.
func (h *helmCluster) values(i int) string {
	repo, digest, _ := strings.Cut(h.images[i], "@")
	return fmt.Sprintf(`runtime: crio
distribution: generic
paths: {imageFs: %q}
image: {repository: %q, digest: %q}
crd: {install: false}
aggregator: {enabled: false}
report: {aggregator: %q, serverName: localhost}
peers: {enabled: false}
imagepind:
  crioReload: signal
  priorityClassName: ""
  logLevel: debug
  nodeSelector: {%s: crio}
  config:
    unpin_delay: 2s
    report: {ca: /var/lib/kubelet/pki/imagepin-aggregator-ca.crt, heartbeat: 1s}
uninstall: {enabled: false}
`, filepath.Join(h.dir, "cluster"), repo, digest, h.c.AggregatorService.Addr, runtimeLabel)
}

func (h *helmCluster) writeValues(t *testing.T, i int) string {
	p := filepath.Join(h.dir, fmt.Sprintf("values-%d.yaml", i))
	if err := os.WriteFile(p, []byte(h.values(i)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func (h *helmCluster) crioNodes() []*env.ClusterNode {
	var out []*env.ClusterNode
	for _, n := range h.c.Nodes {
		if n.Containerd == nil {
			out = append(out, n)
		}
	}
	return out
}

// runtimeConfig are the files of a node's runtime configuration that imagepind may write:
// CRI-O's crio.conf.d, registries.conf.d and certs.d (with crio.conf and registries.conf),
// containerd's hosts.toml tree.
func runtimeConfig(n *env.ClusterNode) []string {
	if n.Containerd != nil {
		return []string{n.Containerd.HostsDir}
	}
	return []string{n.CRIO.Config, n.CRIO.ConfigDir, n.CRIO.RegistriesConf(), n.CRIO.RegistriesConfDir(), n.CRIO.CertsDir()}
}

// stateDir is the node's /var/lib/imagepin (the chart's stateDir).
func stateDir(n *env.ClusterNode) string { return filepath.Join(n.Dir, "imagepin") }

// listing is one line per file and directory under roots: path, type and mode, and the
// sha256 of a file's bytes.
func listing(roots []string) (string, error) {
	var lines []string
	for _, root := range roots {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if os.IsNotExist(err) && p == root {
					lines = append(lines, p+" absent")
					return nil
				}
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			line := fmt.Sprintf("%s %s", p, fi.Mode())
			if fi.Mode().IsRegular() {
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				line += fmt.Sprintf(" %d sha256:%x", len(b), sha256.Sum256(b))
			} else if fi.Mode()&fs.ModeSymlink != 0 {
				l, _ := os.Readlink(p)
				line += " -> " + l
			}
			lines = append(lines, line)
			return nil
		})
		if err != nil {
			return "", err
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n") + "\n", nil
}

// snapshotAll writes each node's listing to <dir>/snapshot-<name>/<node>.
func (h *helmCluster) snapshotAll(name string) func(t *testing.T) {
	return func(t *testing.T) {
		d := filepath.Join(h.dir, "snapshot-"+name)
		os.MkdirAll(d, 0o755)
		for _, n := range h.c.Nodes {
			l, err := listing(runtimeConfig(n))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, n.Name), []byte(l), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d files and directories of its runtime configuration", n.Name, strings.Count(l, "\n"))
		}
	}
}

func (h *helmCluster) install(t *testing.T) {
	// The cluster applied packaging/aggregator/rbac.yaml for its aggregators; the node's
	// part of it is the chart's too.
	h.kubectl(t, "delete", "clusterrolebinding/imagepin-node", "clusterrole/imagepin-node")
	h.helm(t, "install", helmRelease, filepath.Join("..", "..", "packaging", "helm", "imagepin"),
		"--namespace", helmNamespace, "--values", h.writeValues(t, 0))
	h.waitDaemonSet(t, h.images[0], 3*time.Minute)
	t.Logf("imagepind pods:\n%s", h.kubectl(t, "-n", helmNamespace, "get", "pods", "-o", "wide"))
}

// waitDaemonSet waits until imagepind's DaemonSet runs image on every CRI-O node, each
// pod Ready.
func (h *helmCluster) waitDaemonSet(t *testing.T, img string, timeout time.Duration) {
	t.Helper()
	want := len(h.crioNodes())
	deadline := time.Now().Add(timeout)
	for {
		ds, err := h.c.CS.AppsV1().DaemonSets(helmNamespace).Get(t.Context(), "imagepind", metav1.GetOptions{})
		if err == nil && h.daemonSetDone(t, ds, img, want) {
			return
		}
		if time.Now().After(deadline) {
			out, _ := h.kubectlErr("-n", helmNamespace, "describe", "pods")
			t.Fatalf("imagepind's DaemonSet not on %d nodes with %s after %s:\n%s", want, img, timeout, out)
		}
		time.Sleep(time.Second)
	}
}

func (h *helmCluster) daemonSetDone(t *testing.T, ds *appsv1.DaemonSet, img string, want int) bool {
	if ds.Status.ObservedGeneration < ds.Generation || int(ds.Status.UpdatedNumberScheduled) != want || int(ds.Status.NumberReady) != want {
		return false
	}
	pods, err := h.c.CS.CoreV1().Pods(helmNamespace).List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=imagepind"})
	if err != nil || len(pods.Items) != want {
		return false
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Spec.Containers[0].Image != img || !podReady(&p) {
			return false
		}
	}
	return true
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

const helmSet = "shop"

func (h *helmCluster) pin(t *testing.T) {
	p := filepath.Join(h.dir, "set.yaml")
	set := fmt.Sprintf("apiVersion: imagepin.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: %s}\nspec:\n  nodeSelector: {matchLabels: {%s: crio}}\n  pinnedImages:\n  - name: %s\n",
		helmSet, runtimeLabel, h.appV1)
	if err := os.WriteFile(p, []byte(set), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	h.kubectl(t, "apply", "-f", p)
	// The condition is True before the set reaches the nodes (no set yet): the image
	// pinned in CRI-O first, then the condition with the set in it.
	deadline := time.Now().Add(2 * time.Minute)
	for _, n := range h.crioNodes() {
		for {
			out, err := n.Crictl(t.Context(), "inspecti", "-o", "go-template", "--template", "{{.status.pinned}} {{.status.id}}", h.appV1)
			if err == nil && strings.HasPrefix(string(out), "true ") {
				t.Logf("%s: crictl inspecti %s: pinned %s (%s after the apply)", n.Name, h.appV1, strings.TrimSpace(string(out)), time.Since(start).Round(100*time.Millisecond))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s not pinned in CRI-O 2m after the set was applied: %s %v", n.Name, h.appV1, out, err)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	h.waitPinnedReady(t, time.Minute)
}

// waitPinnedReady waits until every CRI-O node's PinnedImagesReady condition (imagepind's
// own, on its Node) is True.
func (h *helmCluster) waitPinnedReady(t *testing.T, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for _, n := range h.crioNodes() {
		for {
			node, err := h.c.CS.CoreV1().Nodes().Get(t.Context(), n.Name, metav1.GetOptions{})
			if err == nil {
				if c := nodeCondition(node, pinnedImagesReady); c != nil && c.Status == corev1.ConditionTrue {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s not True after %s (%v)", n.Name, pinnedImagesReady, timeout, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// snapshotPinned lists each node's runtime configuration with the set pinned: on the
// CRI-O nodes imagepind's pin drop-in is there (what uninstall must take away).
func (h *helmCluster) snapshotPinned(t *testing.T) {
	h.snapshotAll("pinned")(t)
	for _, n := range h.crioNodes() {
		d, _ := exec.Command("diff", "-u", filepath.Join(h.dir, "snapshot-before", n.Name), filepath.Join(h.dir, "snapshot-pinned", n.Name)).CombinedOutput()
		t.Logf("$ diff -u snapshot-before/%s snapshot-pinned/%s\n%s", n.Name, n.Name, d)
		if len(d) == 0 {
			t.Errorf("%s: its runtime configuration with the set pinned is as before the install: imagepind wrote nothing there", n.Name)
		}
	}
}

// rollout cuts the app's registry and rolls out a Deployment of the pinned image on the
// CRI-O nodes: its pods start from what imagepin holds.
func (h *helmCluster) rollout(t *testing.T) {
	h.app.Stop()
	p := filepath.Join(h.dir, "app.yaml")
	if err := os.WriteFile(p, []byte(fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: app, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: app}}
  template:
    metadata: {labels: {app: app}}
    spec:
      hostNetwork: true
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 2
      nodeSelector: {%s: crio}
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app: app}}}
      containers:
      - {name: app, image: %s, imagePullPolicy: IfNotPresent}
`, runtimeLabel, h.appV1)), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	h.kubectl(t, "apply", "-f", p)
	h.kubectl(t, "rollout", "status", "deployment/app", "--timeout", "120s")
	t.Logf("Deployment app rolled out on the CRI-O nodes with its registry gone in %s", time.Since(start).Round(100*time.Millisecond))
}

// upgrade: helm upgrade to the second build of the image, the app's registry still gone.
// Each node's pinned image keeps its ID and its pin, and the sets stay Ready: nothing was
// pulled again (nothing could be).
func (h *helmCluster) upgrade(t *testing.T) {
	ids := map[string]string{}
	for _, n := range h.crioNodes() {
		out, err := n.Crictl(t.Context(), "inspecti", "-o", "go-template", "--template", "{{.status.pinned}} {{.status.id}}", h.appV1)
		if err != nil {
			t.Fatal(err)
		}
		ids[n.Name] = strings.TrimSpace(string(out))
	}
	pulls := h.appPulls()
	h.helm(t, "upgrade", helmRelease, filepath.Join("..", "..", "packaging", "helm", "imagepin"),
		"--namespace", helmNamespace, "--values", h.writeValues(t, 1))
	h.waitDaemonSet(t, h.images[1], 3*time.Minute)
	t.Logf("imagepind pods after the upgrade:\n%s", h.kubectl(t, "-n", helmNamespace, "get", "pods", "-o", "wide"))
	// The new pods have read the node's state and reported by now: give them a few
	// heartbeats to say otherwise.
	time.Sleep(5 * time.Second)
	h.waitPinnedReady(t, 10*time.Second)
	for _, n := range h.crioNodes() {
		out, err := n.Crictl(t.Context(), "inspecti", "-o", "go-template", "--template", "{{.status.pinned}} {{.status.id}}", h.appV1)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(out)); got != ids[n.Name] {
			t.Fatalf("%s: %s was %q before the upgrade, %q after", n.Name, h.appV1, ids[n.Name], got)
		}
		t.Logf("%s: %s still %s", n.Name, h.appV1, ids[n.Name])
	}
	if got := h.appPulls(); got != pulls {
		t.Fatalf("CRI-O's PullImage calls for %s: %d before the upgrade, %d after", h.appRepo(), pulls, got)
	}
	t.Logf("CRI-O's PullImage calls for %s on the CRI-O nodes: %d before the upgrade, %d after: none", h.appRepo(), pulls, pulls)
}

func (h *helmCluster) appRepo() string { repo, _, _ := strings.Cut(h.appV1, "@"); return repo }

// appPulls counts the PullImage calls for the application's image CRI-O logged on every
// CRI-O node ("Pulling image: <ref>", at info level).
func (h *helmCluster) appPulls() int {
	n := 0
	for _, node := range h.crioNodes() {
		b, _ := os.ReadFile(node.CRIO.LogFile)
		n += strings.Count(string(b), "Pulling image: "+h.appRepo())
	}
	return n
}

// uninstall: the chart's pre-delete hook's command (imagepinctl uninstall-nodes with the
// arguments the chart renders; its Job cannot run here: no pod network), then helm
// uninstall. Each node's runtime configuration is then what it was before the install,
// byte for byte and mode for mode; the pins are released and the images still there;
// the state directory holds only the receipt and the lock.
func (h *helmCluster) uninstall(t *testing.T) {
	args := h.hookArgs(t)
	ctl := filepath.Join(h.dir, "imagepinctl")
	if err := env.GoBuild(ctl, "github.com/imagepin/imagepin/cmd/imagepinctl", ""); err != nil {
		t.Fatal(err)
	}
	pulls := h.appPulls()
	reloads := h.crioReloads()
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, ctl, append(args, "--kubeconfig", h.c.Admin)...).CombinedOutput()
	t.Logf("$ imagepinctl %s (%s)\n%s", strings.Join(args, " "), time.Since(start).Round(100*time.Millisecond), out)
	if err != nil {
		t.Logf("imagepind pods:\n%s", h.kubectl(t, "-n", helmNamespace, "get", "pods", "-o", "wide"))
		t.Fatalf("the uninstall hook's command: %v", err)
	}
	h.helm(t, "uninstall", helmRelease, "--namespace", helmNamespace, "--wait")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		pods, err := h.c.CS.CoreV1().Pods(helmNamespace).List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=imagepind"})
		if err == nil && len(pods.Items) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("imagepind's pods still there 2m after helm uninstall: %v", err)
		}
		time.Sleep(time.Second)
	}
	h.snapshotAll("after")(t)
	empty := true
	for _, n := range h.c.Nodes {
		before := filepath.Join(h.dir, "snapshot-before", n.Name)
		after := filepath.Join(h.dir, "snapshot-after", n.Name)
		d, _ := exec.Command("diff", "-u", before, after).CombinedOutput()
		t.Logf("$ diff -u snapshot-before/%s snapshot-after/%s\n%s", n.Name, n.Name, d)
		if len(d) > 0 {
			empty = false
			t.Errorf("%s: its runtime configuration is not what it was before the install", n.Name)
		}
	}
	if empty {
		t.Logf("every node's runtime configuration as before the install: empty diff")
	}
	for _, n := range h.crioNodes() {
		out, err := n.Crictl(t.Context(), "inspecti", "-o", "go-template", "--template", "{{.status.pinned}} {{.status.id}}", h.appV1)
		if err != nil || !strings.HasPrefix(string(out), "false ") {
			t.Errorf("%s: %s after uninstall: %q %v, want present and not pinned", n.Name, h.appV1, out, err)
		}
		entries, _ := os.ReadDir(stateDir(n))
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Logf("%s: %s present, not pinned; state directory holds %v", n.Name, h.appV1, names)
		for _, name := range names {
			if name != nodegiveback.ReceiptFile && name != state.LockFile {
				t.Errorf("%s: %s left in the state directory", n.Name, name)
			}
		}
	}
	if got := h.crioReloads() - reloads; got != len(h.crioNodes()) {
		t.Errorf("CRI-O reloads during the uninstall: %d on %d nodes, want one each", got, len(h.crioNodes()))
	}
	if got := h.appPulls(); got != pulls {
		t.Errorf("PullImage calls for %s during the uninstall: %d", h.appRepo(), got-pulls)
	}
}

// crioReloads counts CRI-O's configuration reloads (SIGHUP) on the CRI-O nodes.
func (h *helmCluster) crioReloads() int {
	n := 0
	for _, node := range h.crioNodes() {
		b, _ := os.ReadFile(node.CRIO.LogFile)
		n += strings.Count(string(b), "Reloading configuration")
	}
	return n
}

// hookArgs are the arguments of the chart's pre-delete hook Job (imagepinctl's), as helm
// renders them for this cluster's values.
func (h *helmCluster) hookArgs(t *testing.T) []string {
	p := filepath.Join(h.dir, "values-hook.yaml")
	if err := os.WriteFile(p, []byte("uninstall: {enabled: true}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := h.helm(t, "template", helmRelease, filepath.Join("..", "..", "packaging", "helm", "imagepin"), "--namespace", helmNamespace,
		"--kube-version", "1.36.0", "--values", h.writeValues(t, 1), "--values", p, "--show-only", "templates/uninstall-hook.yaml")
	for _, doc := range strings.Split(out, "\n---") {
		var job batchv1.Job
		if err := yaml.Unmarshal([]byte(doc), &job); err != nil || job.Kind != "Job" {
			continue
		}
		c := job.Spec.Template.Spec.Containers[0]
		if len(c.Command) != 1 || c.Command[0] != "/usr/bin/imagepinctl" {
			t.Fatalf("the hook's Job runs %v", c.Command)
		}
		return c.Args
	}
	t.Fatalf("no Job in the chart's uninstall hook:\n%s", out)
	return nil
}
