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
	// joined is the CRI-O node that joins under the startup taint (the join step).
	joined *env.ClusterNode
	// mirrorPort is the containerd release's node-local mirror's loopback port.
	mirrorPort int
	failed     bool
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
	h.step("join", h.join)
	h.step("registry gone, roll out", h.rollout)
	h.step("upgrade", h.upgrade)
	h.step("uninstall", h.uninstall)
	// The containerd node as k3s lays it out, from a second install of the same release
	// (the chart's objects are cluster-wide: one release at a time).
	h.step("k3s: install", h.k3sInstall)
	h.step("k3s: pin", h.k3sPin)
	h.step("k3s: upgrade", h.k3sUpgrade)
	h.step("k3s: uninstall", h.k3sUninstall)
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
	if h.mirrorPort, err = env.FreePort(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("cluster logs:\n%s", c.LogTails(25))
			// The API server cannot reach the kubelets by name: the runtimes' logs.
			for _, n := range h.c.Nodes {
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

// values are the chart's values for this cluster, with imagepin's image build i, for the
// CRI-O nodes (kubeadm's layout) or, containerd, for the containerd node (k3s's).
//   - aggregator.enabled false, report.*: the cluster runs its own aggregators (processes,
//     as env.Cluster starts them): pods here have no network but the host's and no
//     Services (no kube-proxy, no DNS), so the chart's aggregator Deployment could not be
//     reached. imagepind reports to the cluster's, whose CA the nodes hold in the kubelet's
//     pki directory (k3s's agent directory on the containerd node).
//   - crd.install false: the cluster made the CRD as it was shipped before the chart.
//   - peers.enabled false on the CRI-O nodes: every node shares the host's network here,
//     and the mirror listens on one loopback port on every node. The containerd release
//     runs on one node: its mirror (no sharing) on a free loopback port, so that its
//     hosts.toml is written and given back.
//   - imagepind.crioReload signal: no systemd on these nodes.
//   - imagepind.nodeSelector: the runtime's nodes (one preset per release).
//   - imagepind.priorityClassName "": system-node-critical makes the kubelet give the
//     container an oom_score_adj of -997, which this machine's processes may not set
//     (they lack CAP_SYS_RESOURCE).
//   - uninstall.enabled false: the hook's Job talks to the API through the kubernetes
//     Service, which has no proxy here: the test runs its command itself.
//   - paths.imageFs: each node's runtime keeps its images under the test's directory
//     (<cluster>/nN/…), not at the preset's path: the directory of all nodes, read-only.
func (h *helmCluster) values(i int, containerd bool) string {
	repo, digest, _ := strings.Cut(h.images[i], "@")
	preset, sel, ca, peers := "runtime: crio\ndistribution: generic", "crio", "/var/lib/kubelet/pki", "peers: {enabled: false}"
	if containerd {
		preset, sel, ca = "runtime: containerd\ndistribution: k3s", "containerd", "/var/lib/rancher/k3s/agent"
		peers = "peers: {enabled: true, share: false}"
	}
	return fmt.Sprintf(`%s
paths: {imageFs: %q}
image: {repository: %q, digest: %q}
crd: {install: false}
aggregator: {enabled: false}
report: {aggregator: %q, serverName: localhost}
%s
imagepind:
  crioReload: signal
  priorityClassName: ""
  logLevel: debug
  nodeSelector: {%s: %s}
  config:
    unpin_delay: 2s
    report: {ca: %s/imagepin-aggregator-ca.crt, heartbeat: 1s}
    peers: {mirror_address: "127.0.0.1:%d"}
uninstall: {enabled: false}
`, preset, filepath.Join(h.dir, "cluster"), repo, digest, h.c.AggregatorService.Addr, peers, runtimeLabel, sel, ca, h.mirrorPort)
}

func (h *helmCluster) writeValues(t *testing.T, i int, containerd bool) string {
	p := filepath.Join(h.dir, fmt.Sprintf("values-%d-%v.yaml", i, containerd))
	if err := os.WriteFile(p, []byte(h.values(i, containerd)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func (h *helmCluster) containerdNodes() []*env.ClusterNode {
	var out []*env.ClusterNode
	for _, n := range h.c.Nodes {
		if n.Containerd != nil {
			out = append(out, n)
		}
	}
	return out
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
		"--namespace", helmNamespace, "--values", h.writeValues(t, 0, false))
	h.waitDaemonSet(t, h.images[0], h.crioNodes(), 3*time.Minute)
	t.Logf("imagepind pods:\n%s", h.kubectl(t, "-n", helmNamespace, "get", "pods", "-o", "wide"))
}

// waitDaemonSet waits until imagepind's DaemonSet runs image on each of nodes (and no
// other), each pod Ready.
func (h *helmCluster) waitDaemonSet(t *testing.T, img string, nodes []*env.ClusterNode, timeout time.Duration) {
	t.Helper()
	want := len(nodes)
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

func (h *helmCluster) pin(t *testing.T) { h.pinOn(t, helmSet, "crio", h.crioNodes()) }

// pinOn applies the set name of the application's image to the nodes labelled runtime
// and waits until it is pinned in the runtime on each of nodes and their
// PinnedImagesReady is True.
func (h *helmCluster) pinOn(t *testing.T, name, runtime string, nodes []*env.ClusterNode) {
	p := filepath.Join(h.dir, name+".yaml")
	set := fmt.Sprintf("apiVersion: imagepin.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: %s}\nspec:\n  nodeSelector: {matchLabels: {%s: %s}}\n  pinnedImages:\n  - name: %s\n",
		name, runtimeLabel, runtime, h.appV1)
	if err := os.WriteFile(p, []byte(set), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	h.kubectl(t, "apply", "-f", p)
	// The condition is True before the set reaches the nodes (no set yet): the image
	// pinned in the runtime first, then the condition with the set in it.
	for _, n := range nodes {
		h.waitPinned(t, n, start, 2*time.Minute)
	}
	h.waitPinnedReady(t, nodes, time.Minute)
}

// waitPinned waits until the application's image is pinned in n's runtime (crictl
// inspecti), and logs when, after since.
func (h *helmCluster) waitPinned(t *testing.T, n *env.ClusterNode, since time.Time, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, err := n.Crictl(t.Context(), "inspecti", "-o", "go-template", "--template", "{{.status.pinned}} {{.status.id}}", h.appV1)
		if err == nil && strings.HasPrefix(string(out), "true ") {
			t.Logf("%s: crictl inspecti %s: pinned %s (%s later)", n.Name, h.appV1, strings.TrimSpace(string(out)), time.Since(since).Round(100*time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s not pinned in %s after %s: %s %v", n.Name, h.appV1, n.Runtime(), timeout, out, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitPinnedReady waits until each node's PinnedImagesReady condition (imagepind's own,
// on its Node) is True.
func (h *helmCluster) waitPinnedReady(t *testing.T, nodes []*env.ClusterNode, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for _, n := range nodes {
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
func (h *helmCluster) upgrade(t *testing.T) { h.upgradeOn(t, h.crioNodes(), false) }

func (h *helmCluster) upgradeOn(t *testing.T, nodes []*env.ClusterNode, containerd bool) {
	ids := map[string]string{}
	for _, n := range nodes {
		out, err := n.Crictl(t.Context(), "inspecti", "-o", "go-template", "--template", "{{.status.pinned}} {{.status.id}}", h.appV1)
		if err != nil {
			t.Fatal(err)
		}
		ids[n.Name] = strings.TrimSpace(string(out))
	}
	pulls := h.appPulls(nodes)
	h.helm(t, "upgrade", helmRelease, filepath.Join("..", "..", "packaging", "helm", "imagepin"),
		"--namespace", helmNamespace, "--values", h.writeValues(t, 1, containerd))
	h.waitDaemonSet(t, h.images[1], nodes, 3*time.Minute)
	t.Logf("imagepind pods after the upgrade:\n%s", h.kubectl(t, "-n", helmNamespace, "get", "pods", "-o", "wide"))
	// The new pods have read the node's state and reported by now: give them a few
	// heartbeats to say otherwise.
	time.Sleep(5 * time.Second)
	h.waitPinnedReady(t, nodes, 10*time.Second)
	for _, n := range nodes {
		out, err := n.Crictl(t.Context(), "inspecti", "-o", "go-template", "--template", "{{.status.pinned}} {{.status.id}}", h.appV1)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(out)); got != ids[n.Name] {
			t.Fatalf("%s: %s was %q before the upgrade, %q after", n.Name, h.appV1, ids[n.Name], got)
		}
		t.Logf("%s: %s still %s", n.Name, h.appV1, ids[n.Name])
	}
	what := map[bool]string{false: "CRI-O's PullImage calls", true: "containerd's PullImage calls"}[containerd]
	if got := h.appPulls(nodes); got != pulls {
		t.Fatalf("%s for %s: %d before the upgrade, %d after", what, h.appRepo(), pulls, got)
	}
	t.Logf("%s for %s on %d node(s): %d before the upgrade, %d after: none", what, h.appRepo(), len(nodes), pulls, pulls)
}

func (h *helmCluster) appRepo() string { repo, _, _ := strings.Cut(h.appV1, "@"); return repo }

// appPulls counts the PullImage calls for the application's image the runtimes of nodes
// logged: CRI-O's "Pulling image: <ref>", containerd's `PullImage "<ref>"` (both at info
// level; containerd's line of the result, `… returns image reference …`, not counted).
func (h *helmCluster) appPulls(nodes []*env.ClusterNode) int {
	n := 0
	for _, node := range nodes {
		if node.Containerd != nil {
			b, _ := os.ReadFile(node.Containerd.LogFile)
			for _, l := range strings.Split(string(b), "\n") {
				if strings.Contains(l, `PullImage \"`+h.appRepo()) && !strings.Contains(l, "returns") {
					n++
				}
			}
			continue
		}
		b, _ := os.ReadFile(node.CRIO.LogFile)
		n += strings.Count(string(b), "Pulling image: "+h.appRepo())
	}
	return n
}

// uninstall: the chart's pre-delete hook's command (imagepinctl uninstall-nodes with the
// arguments the chart renders; its Job cannot run here: no pod network), then helm
// uninstall. Each node's runtime configuration is then what it was before the install,
// byte for byte and mode for mode; the pins are released and the images still there;
// the state directory holds only the receipt and the lock; CRI-O reloaded once per node.
func (h *helmCluster) uninstall(t *testing.T) {
	reloads := h.crioReloads()
	h.uninstallOn(t, h.crioNodes(), false)
	if got := h.crioReloads() - reloads; got != len(h.crioNodes()) {
		t.Errorf("CRI-O reloads during the uninstall: %d on %d nodes, want one each", got, len(h.crioNodes()))
	}
}

func (h *helmCluster) uninstallOn(t *testing.T, nodes []*env.ClusterNode, containerd bool) {
	args := h.hookArgs(t, containerd)
	ctl := filepath.Join(h.dir, "imagepinctl")
	if _, err := os.Stat(ctl); err != nil {
		if err := env.GoBuild(ctl, "github.com/imagepin/imagepin/cmd/imagepinctl", ""); err != nil {
			t.Fatal(err)
		}
	}
	pulls := h.appPulls(nodes)
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
	after := "after" + map[bool]string{false: "", true: "-k3s"}[containerd]
	h.snapshotAll(after)(t)
	empty := true
	for _, n := range h.c.Nodes {
		d, _ := exec.Command("diff", "-u", filepath.Join(h.dir, "snapshot-before", n.Name), filepath.Join(h.dir, "snapshot-"+after, n.Name)).CombinedOutput()
		t.Logf("$ diff -u snapshot-before/%s snapshot-%s/%s\n%s", n.Name, after, n.Name, d)
		if len(d) > 0 {
			empty = false
			t.Errorf("%s: its runtime configuration is not what it was before the install", n.Name)
		}
	}
	if empty {
		t.Logf("every node's runtime configuration as before the install: empty diff")
	}
	for _, n := range nodes {
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
	if got := h.appPulls(nodes); got != pulls {
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
func (h *helmCluster) hookArgs(t *testing.T, containerd bool) []string {
	p := filepath.Join(h.dir, "values-hook.yaml")
	if err := os.WriteFile(p, []byte("uninstall: {enabled: true}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := h.helm(t, "template", helmRelease, filepath.Join("..", "..", "packaging", "helm", "imagepin"), "--namespace", helmNamespace,
		"--kube-version", "1.36.0", "--values", h.writeValues(t, 1, containerd), "--values", p, "--show-only", "templates/uninstall-hook.yaml")
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

// join: a CRI-O node joins through the chart. Its kubelet registers with the startup
// taint; imagepind's DaemonSet (which tolerates it) puts a pod there once the node is
// labelled a CRI-O node; that pod pins the set; the cluster's aggregator lifts the taint;
// a pod meant for the node, Pending until then, starts. The registry is still there:
// peers are off here (one host network: every node's mirror and peer port would be one
// loopback port), so a joining node has nowhere else to pull from.
func (h *helmCluster) join(t *testing.T) {
	n, err := h.c.AddNode(t.Context(), env.NodeOptions{Taints: []string{startupTaint + ":NoSchedule"}, NoPeers: true})
	if err != nil {
		t.Fatal(err)
	}
	h.joined = n
	// Its runtime configuration before imagepind (no pod before the label): the
	// uninstall's diff covers it too.
	l, err := listing(runtimeConfig(n))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.dir, "snapshot-before", n.Name), []byte(l), 0o644); err != nil {
		t.Fatal(err)
	}
	var node *corev1.Node
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if node, err = h.c.CS.CoreV1().Nodes().Get(t.Context(), n.Name, metav1.GetOptions{}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not registered 1m after its kubelet started: %v", n.Name, err)
		}
	}
	if !hasTaint(node, startupTaint) {
		t.Fatalf("%s registered without the startup taint: %+v", n.Name, node.Spec.Taints)
	}
	t.Logf("%s registered %s after its kubelet started, taints %v", n.Name, time.Since(n.Started).Round(100*time.Millisecond), node.Spec.Taints)
	p := filepath.Join(h.dir, "join-pod.yaml")
	if err := os.WriteFile(p, []byte(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: joined-app, namespace: default}
spec:
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
  nodeSelector: {kubernetes.io/hostname: %s}
  containers:
  - {name: app, image: %s, imagePullPolicy: IfNotPresent}
`, n.Name, h.appV1)), 0o644); err != nil {
		t.Fatal(err)
	}
	h.kubectl(t, "apply", "-f", p)
	h.kubectl(t, "label", "node", n.Name, runtimeLabel+"=crio")
	labelled := time.Now()
	var dsReady, pinned, lifted time.Duration
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		node, err := h.c.CS.CoreV1().Nodes().Get(t.Context(), n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod, err := h.c.CS.CoreV1().Pods("default").Get(t.Context(), "joined-app", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tainted := hasTaint(node, startupTaint)
		if tainted && pod.Spec.NodeName != "" {
			t.Fatalf("pod joined-app bound to %s while the node has the startup taint", pod.Spec.NodeName)
		}
		if dsReady == 0 {
			pods, err := h.c.CS.CoreV1().Pods(helmNamespace).List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=imagepind", FieldSelector: "spec.nodeName=" + n.Name})
			if err == nil && len(pods.Items) == 1 && podReady(&pods.Items[0]) {
				dsReady = time.Since(labelled)
				t.Logf("%s: imagepind's pod %s (image %s) Ready %s after the label, the node tainted: %v", n.Name, pods.Items[0].Name, pods.Items[0].Spec.Containers[0].Image, dsReady.Round(100*time.Millisecond), tainted)
			}
		}
		if pinned == 0 {
			out, err := n.Crictl(t.Context(), "inspecti", "-o", "go-template", "--template", "{{.status.pinned}}", h.appV1)
			if err == nil && strings.TrimSpace(string(out)) == "true" {
				pinned = time.Since(labelled)
				t.Logf("%s: %s pinned in CRI-O %s after the label, the node tainted: %v", n.Name, h.appV1, pinned.Round(100*time.Millisecond), tainted)
			}
		}
		if !tainted && lifted == 0 {
			lifted = time.Since(labelled)
			t.Logf("%s: the startup taint lifted %s after the label", n.Name, lifted.Round(100*time.Millisecond))
			if pinned == 0 {
				t.Fatalf("%s: the startup taint lifted before the set was pinned", n.Name)
			}
		}
		if lifted > 0 && pod.Status.Phase == corev1.PodRunning {
			t.Logf("pod joined-app Running on %s %s after the label (Pending while the node was tainted)", pod.Spec.NodeName, time.Since(labelled).Round(100*time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s 3m after the label: imagepind Ready %v, pinned %v, taint lifted %v, joined-app %s on %q", n.Name, dsReady, pinned, lifted, pod.Status.Phase, pod.Spec.NodeName)
		}
	}
	h.waitDaemonSet(t, h.images[0], h.crioNodes(), time.Minute)
	h.waitPinnedReady(t, h.crioNodes(), 30*time.Second)
}

// k3sInstall: the same release installed again, with the containerd preset for k3s's
// layout and a nodeSelector of the containerd node, after the CRI-O release's uninstall.
// The application's registry is back (the node pulls the set through imagepind).
func (h *helmCluster) k3sInstall(t *testing.T) {
	if err := h.app.Restart(); err != nil {
		t.Fatal(err)
	}
	h.helm(t, "install", helmRelease, filepath.Join("..", "..", "packaging", "helm", "imagepin"),
		"--namespace", helmNamespace, "--values", h.writeValues(t, 0, true))
	h.waitDaemonSet(t, h.images[0], h.containerdNodes(), 3*time.Minute)
	t.Logf("imagepind pods:\n%s", h.kubectl(t, "-n", helmNamespace, "get", "pods", "-o", "wide"))
}

// k3sPin pins the set on the containerd node: the image pinned in containerd, the node's
// mirror written into the registry's hosts.toml (the diff from before is not empty);
// then the registry is cut again.
func (h *helmCluster) k3sPin(t *testing.T) {
	nodes := h.containerdNodes()
	h.pinOn(t, "k3s", "containerd", nodes)
	h.snapshotAll("k3s-pinned")(t)
	for _, n := range nodes {
		d, _ := exec.Command("diff", "-u", filepath.Join(h.dir, "snapshot-before", n.Name), filepath.Join(h.dir, "snapshot-k3s-pinned", n.Name)).CombinedOutput()
		t.Logf("$ diff -u snapshot-before/%s snapshot-k3s-pinned/%s\n%s", n.Name, n.Name, d)
		if len(d) == 0 {
			t.Errorf("%s: its hosts.toml tree with the set pinned is as before the install: imagepind wrote no mirror there", n.Name)
		}
		tomls, _ := filepath.Glob(filepath.Join(n.Containerd.HostsDir, "*", "hosts.toml"))
		for _, f := range tomls {
			b, _ := os.ReadFile(f)
			t.Logf("%s: %s:\n%s", n.Name, f, b)
		}
	}
	h.app.Stop()
}

func (h *helmCluster) k3sUpgrade(t *testing.T) { h.upgradeOn(t, h.containerdNodes(), true) }

func (h *helmCluster) k3sUninstall(t *testing.T) { h.uninstallOn(t, h.containerdNodes(), true) }
