//go:build e2e

package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/imagepin/imagepin/api/v1alpha1"
	"github.com/imagepin/imagepin/kubelet"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
)

// What the whole-cluster scenario asserts beyond what imagepin does everywhere else;
// each switches on a step that needs it.
const (
	// withNodeCondition: imagepind publishes the Node condition PinnedImagesReady, and the
	// aggregator's leader removes the startup taint once it is True.
	withNodeCondition = true
	// withSetsFromRuns: imagepinctl writes a set from a Deployment's template.
	withSetsFromRuns = true
	// withTags: the sets pin repo:tag@sha256:… and the pods of v2 and the agent name
	// the tag (off: they name the digest). The joining node's PinnedImagesReady waits
	// for its runtime to hold the pinned tags (TagsNotHeld), so its taint goes only then.
	withTags = true

	pinnedImagesReady = "PinnedImagesReady"
	startupTaint      = "imagepin.io/images-not-ready"
	taintRemovedEvent = "StartupTaintRemoved"
	sourceRegistry    = "src.example.invalid"
)

// wholeCluster is one real cluster shared by the scenario's steps: three registered
// nodes (node-2 on containerd), a private registry behind a counting link, the images
// of an app in three versions (v2 is v1's layers and one more, as releases are), a node
// agent and the pause image.
type wholeCluster struct {
	t    *testing.T
	dir  string
	c    *env.Cluster
	priv *env.Registry
	link *env.Proxy
	// host is the registry as the images name it: the link, or a source it stands in for.
	host string
	// Each image by tag (through the link) and by digest.
	pause, appV1, appV2, appV3, agent taggedImage
	// appBase is the layer v1 has of its own and v2 builds on (v1's last layer).
	appBase string
	// unheld is what the verdict before the cut said of the blobs that the cluster's
	// stores did not hold on two nodes: reported at the end, once the replaced node's
	// join has shown what it costs.
	unheld []string
	// failed stops the later steps once one failed: they build on it.
	failed bool
	// Durations for the numbers.
	rolloutGone, joinSetsReady, joinUntainted time.Duration
	// joinTaintAfterReady: from the joining node's sets Ready (its log) to its taint
	// gone (the watch).
	joinTaintAfterReady time.Duration
}

type taggedImage struct {
	tag, digest string // repo:tag, repo@sha256:…
	// contents are the digests a pull fetches: manifest, config, layers.
	contents []string
}

// pinned is the reference a set pins: repo:tag@sha256:… where sets pin tags.
func (i taggedImage) pinned() string {
	if withTags {
		return i.tag + "@" + strings.SplitN(i.digest, "@", 2)[1]
	}
	return i.digest
}

// podRef is what a pod names once its image is pinned: the tag where a set pins tags.
func (i taggedImage) podRef() string {
	if withTags {
		return i.tag
	}
	return i.digest
}

func newWholeCluster(t *testing.T) *wholeCluster {
	t.Helper()
	dir := t.TempDir()
	ctx := t.Context()
	os.MkdirAll(filepath.Join(dir, "registry"), 0o755)
	priv, err := env.StartAuthRegistry(filepath.Join(dir, "registry"), "puller", "e2e-s3cret")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(priv.Stop)
	link, err := env.StartLink(priv.Host, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(link.Close)
	w := &wholeCluster{t: t, dir: dir, priv: priv, link: link, host: link.Addr}
	var locations map[string]string
	if withTags {
		// CRI-O holds every loopback registry insecure and verifies no TLS for it, so
		// imagepind gives its repositories no tag endpoint: the images the sets pin are
		// named by a source that does not exist, which each node reaches at the link.
		// (A kubelet's pull of such a name fails on CRI-O: the pod's credentials name
		// the source, the endpoint asked is the link. So v1, which the kubelets pull,
		// keeps the link's name.)
		w.host, locations = sourceRegistry, map[string]string{sourceRegistry: link.Addr}
	}
	app := filepath.Join(dir, "podapp")
	if err := env.GoBuild(app, "github.com/imagepin/imagepin/test/podapp", "-s -w"); err != nil {
		t.Fatal(err)
	}
	// Each image is the binary's layer (the same in every image) and 1 MiB layers of
	// its own: something to move.
	layer := func() v1.Layer {
		l, err := env.RandomLayer(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	push := func(host, repo, tag string, layers ...v1.Layer) taggedImage {
		img, err := priv.PushRunnableWith(ctx, repo, app, layers...)
		if err != nil {
			t.Fatal(err)
		}
		if err := priv.Tag(ctx, img, tag); err != nil {
			t.Fatal(err)
		}
		contents, err := priv.Contents(ctx, img)
		if err != nil {
			t.Fatal(err)
		}
		repoViaLink := strings.Replace(img.Repo, priv.Host, host, 1)
		return taggedImage{tag: repoViaLink + ":" + tag, digest: repoViaLink + "@" + img.Digest, contents: contents}
	}
	// v1 is what the kubelets pull with the pull secret, by the registry's own address;
	// the rest is named as the sets pin it. v2 is v1's layers and one more, as a release
	// is built on the one before: a node that runs v1 has all of v2 but its last layer.
	base := layer()
	if d, err := base.Digest(); err != nil {
		t.Fatal(err)
	} else {
		w.appBase = d.String()
	}
	w.pause = push(w.host, "pause", "3.10")
	w.appV1 = push(link.Addr, "shop/app", "v1", base)
	w.appV2, w.appV3 = push(w.host, "shop/app", "v2", base, layer()), push(w.host, "shop/app", "v3", layer())
	w.agent = push(w.host, "shop/agent", "v1", layer())

	// The node's pull secret names the registry as the images do and, where a source
	// stands for it, as the nodes reach it.
	auths := map[string]map[string]string{w.host: {"auth": priv.Auth()}, link.Addr: {"auth": priv.Auth()}}
	secret, err := json.Marshal(map[string]any{"auths": auths})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c, err := env.StartCluster(ctx, filepath.Join(dir, "cluster"), env.ClusterOptions{
		Nodes: 3, ContainerdNodes: []int{2}, Bin: binDir, Packaging: filepath.Join("..", "..", "packaging", "aggregator"),
		Insecure: []string{link.Addr}, Locations: locations, PauseImage: w.pause.digest, PullSecret: secret,
	})
	if err != nil {
		t.Fatal(err)
	}
	w.c = c
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("cluster logs:\n%s", c.LogTails(25))
		}
		c.Stop()
	})
	t.Logf("cluster up in %s: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, 2 aggregators, 3 Ready nodes (node-0, node-1 on CRI-O, node-2 on containerd)",
		time.Since(start).Round(100*time.Millisecond))
	return w
}

// step runs one step of the scenario as a subtest; once one fails the rest are skipped.
func (w *wholeCluster) step(name string, f func(t *testing.T)) {
	w.t.Run(name, func(t *testing.T) {
		if w.failed {
			t.Skip("an earlier step failed")
		}
		defer func() { w.failed = w.failed || t.Failed() }()
		f(t)
	})
}

// kubectl runs the real kubectl as the admin and logs the command line; it fails the
// test on an error.
func (w *wholeCluster) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := w.c.Kubectl(t.Context(), args...)
	t.Logf("$ kubectl %s\n%s", shellWords(args), strings.TrimRight(string(out), "\n"))
	if err != nil {
		t.Fatalf("%s: %v", env.KubectlCommand(args...), err)
	}
	return string(out)
}

// apply writes a manifest into the test's directory and applies it with kubectl.
func (w *wholeCluster) apply(t *testing.T, name, manifest string) string {
	t.Helper()
	p := filepath.Join(w.dir, name)
	if err := os.WriteFile(p, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	w.kubectl(t, "apply", "-f", p)
	return p
}

func setManifest(name string, refs ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: imagepin.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: %s}\nspec:\n  nodeSelector: {}\n  pinnedImages:\n", name)
	for _, r := range refs {
		fmt.Fprintf(&b, "  - name: %s\n", r)
	}
	return b.String()
}

// setStatus is a set's status from the API (current: observed its generation).
func (w *wholeCluster) setStatus(name string) (v1alpha1.Status, bool) {
	u, err := w.c.Dyn.Resource(v1alpha1.GroupVersionResource).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return v1alpha1.Status{}, false
	}
	var st v1alpha1.Status
	m, _ := u.Object["status"].(map[string]any)
	if m == nil || runtime.DefaultUnstructuredConverter.FromUnstructured(m, &st) != nil {
		return v1alpha1.Status{}, false
	}
	return st, st.ObservedGeneration == u.GetGeneration()
}

// waitSetReady waits until the API says the set is Ready on n of n nodes and
// RegistryIndependent.
func (w *wholeCluster) waitSetReady(t *testing.T, name string, n int, timeout time.Duration) v1alpha1.Status {
	t.Helper()
	var last v1alpha1.Status
	waitUntil(t, fmt.Sprintf("set %s Ready %d/%d and RegistryIndependent in the API", name, n, n), timeout, func() bool {
		st, current := w.setStatus(name)
		last = st
		r := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
		ri := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionRegistryIndependent)
		return current && r != nil && r.Status == metav1.ConditionTrue && st.ReadyNodes == n && st.TargetedNodes == n &&
			ri != nil && ri.Status == metav1.ConditionTrue
	})
	return last
}

// pods are the pods whose labels match selector.
func (w *wholeCluster) pods(t *testing.T, selector string) []corev1.Pod {
	t.Helper()
	l, err := w.c.CS.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func running(p corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
		return false
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running == nil {
			return false
		}
	}
	return len(p.Status.ContainerStatuses) > 0
}

// requireRunning asserts from the API that the pods matching selector are want, all
// Running with image, on distinct nodes when spread, and from each node's runtime that
// a container of that pod runs there.
func (w *wholeCluster) requireRunning(t *testing.T, selector, image string, want int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	waitUntil(t, fmt.Sprintf("%d pods %s Running with %s", want, selector, image), 120*time.Second, func() bool {
		pods = nil
		for _, p := range w.pods(t, selector) {
			if p.DeletionTimestamp == nil {
				pods = append(pods, p)
			}
		}
		ok := len(pods) == want
		for _, p := range pods {
			ok = ok && running(p) && p.Spec.Containers[0].Image == image
		}
		return ok
	})
	for _, p := range pods {
		n := w.c.Node(p.Spec.NodeName)
		if n == nil {
			t.Fatalf("pod %s on %q, not a node of this cluster", p.Name, p.Spec.NodeName)
		}
		out, err := n.Crictl(t.Context(), "ps", "--pod", podSandbox(t, n, p), "-o", "json")
		if err != nil {
			t.Fatalf("%s: crictl ps: %v\n%s", n.Name, err, out)
		}
		var ps struct {
			Containers []struct {
				State string `json:"state"`
				Image struct {
					Image string `json:"image"`
				} `json:"image"`
				ImageRef string `json:"imageRef"`
			} `json:"containers"`
		}
		if err := json.Unmarshal(out, &ps); err != nil || len(ps.Containers) == 0 || ps.Containers[0].State != "CONTAINER_RUNNING" {
			t.Fatalf("%s (%s): pod %s has no running container in the runtime: %v\n%s", n.Name, n.Runtime(), p.Name, err, out)
		}
	}
	return pods
}

// podSandbox is the runtime's sandbox ID of a pod, by its UID label.
func podSandbox(t *testing.T, n *env.ClusterNode, p corev1.Pod) string {
	t.Helper()
	out, err := n.Crictl(t.Context(), "pods", "-q", "--label", "io.kubernetes.pod.uid="+string(p.UID), "--state", "ready")
	if err != nil || strings.TrimSpace(string(out)) == "" {
		t.Fatalf("%s (%s): no ready sandbox for pod %s: %v %s", n.Name, n.Runtime(), p.Name, err, out)
	}
	return strings.Fields(string(out))[0]
}

// events are the events of the pods matching selector with the reason (Pulled,
// Pulling, Failed, FailedScheduling...).
func (w *wholeCluster) events(t *testing.T, pods []corev1.Pod, reason string) []corev1.Event {
	t.Helper()
	l, err := w.c.CS.CoreV1().Events("default").List(t.Context(), metav1.ListOptions{FieldSelector: "reason=" + reason})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Event
	for _, e := range l.Items {
		for _, p := range pods {
			if e.InvolvedObject.UID == p.UID {
				out = append(out, e)
			}
		}
	}
	return out
}

// quote logs a component's own lines (the first max) that contain every string: what
// the closing note of a run quotes.
func (w *wholeCluster) quote(t *testing.T, component string, max int, contains ...string) {
	t.Helper()
	lines := w.c.LogLines(component, contains...)
	for i, l := range lines {
		if i == max {
			break
		}
		t.Logf("%s: %s", component, l)
	}
}

// quoteKubelets logs, per node, the kubelet's first line that contains every string.
func (w *wholeCluster) quoteKubelets(t *testing.T, contains ...string) {
	t.Helper()
	for _, n := range w.c.Nodes {
		if l := n.Kubelet.Lines(contains...); len(l) > 0 {
			t.Logf("%s kubelet: %s", n.Name, l[0])
		}
	}
}

// imagepinctlStdout runs imagepinctl and returns its standard output (its standard
// error goes to the test's log) and exit code.
func imagepinctlStdout(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "imagepinctl"), args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	t.Logf("$ imagepinctl %s   (exit %d)\n%s%s", shellWords(args), code, stderr.String(), out)
	return string(out), code
}

// shellWords is args as a shell command line would spell them (an empty one as "").
func shellWords(args []string) string {
	var out []string
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'$") {
			a = strconv.Quote(a)
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

// imagepinctl runs imagepinctl and returns its output and exit code.
func imagepinctl(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(filepath.Join(binDir, "imagepinctl"), args...).CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	t.Logf("$ imagepinctl %s   (exit %d)\n%s", shellWords(args), code, strings.TrimRight(string(out), "\n"))
	return string(out), code
}

func appManifest(image string, replicas int) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: app, namespace: default}
spec:
  replicas: %d
  selector: {matchLabels: {app: app}}
  strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  template:
    metadata: {labels: {app: app}}
    spec:
      hostNetwork: true
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 2
      imagePullSecrets: [{name: regcred}]
      # At most one replica of a version per node: a replica added while a node is held
      # back waits for that node.
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app: app}}, matchLabelKeys: [pod-template-hash]}
      containers:
      - {name: app, image: %s, imagePullPolicy: IfNotPresent}
`, replicas, image)
}

func agentManifest(image string) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: default}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      hostNetwork: true
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 2
      imagePullSecrets: [{name: regcred}]
      containers:
      - {name: agent, image: %s, imagePullPolicy: IfNotPresent}
`, image)
}

// The whole cluster with the registry gone, as an administrator runs it: a
// Deployment from a private registry, pulled by the kubelets; the sets of what runs and
// of its next version, which shares v1's layers; the registry cut; the rollout; a node
// replaced, the new one held back until its images are in from its peers; and the
// control, an image no set pins.
func TestWholeClusterRegistryGone(t *testing.T) {
	start := time.Now()
	w := newWholeCluster(t)
	w.step("a_app_v1_running_and_v1_v2_sets_ready", w.appV1AndSets)
	w.step("b_rollout_to_v2_with_the_registry_gone", w.rolloutRegistryGone)
	w.step("c_node_replaced_held_back_until_its_sets_are_ready_from_its_peers", w.nodeReplaced)
	w.step("d_control_an_unpinned_image_with_the_registry_gone", w.control)
	t.Logf("numbers: rollout to v2 with the registry gone %s; the joining node: registration → sets Ready %s, → startup taint removed %s (sets Ready → taint gone %d ms); the whole test %s",
		w.rolloutGone.Round(100*time.Millisecond), w.joinSetsReady.Round(100*time.Millisecond), w.joinUntainted.Round(100*time.Millisecond),
		w.joinTaintAfterReady.Milliseconds(), time.Since(start).Round(time.Second))
	if len(w.unheld) > 0 {
		t.Errorf("before the cut the verdicts said the registry could go, but the cluster's stores did not hold every blob on two nodes:\n%s",
			strings.Join(w.unheld, "\n"))
	}
}

// (a) The base set (pause and agent images) Ready; app v1 (3 replicas, by digest, with a
// pull secret) and the agent DaemonSet Running, v1 pulled by the kubelets themselves from
// the private registry (no set names it yet: no node's mirror is in the way); the set of
// what runs (app-v1, made from the pods) Ready; then the Deployment paused at its next
// template (v2), the set for it Ready 3/3 and RegistryIndependent.
func (w *wholeCluster) appV1AndSets(t *testing.T) {
	w.apply(t, "base-set.yaml", setManifest("base", w.pause.pinned(), w.agent.pinned()))
	w.waitSetReady(t, "base", 3, 180*time.Second)
	w.kubectl(t, "create", "secret", "docker-registry", "regcred", "--docker-server", w.link.Addr,
		"--docker-username", w.priv.User, "--docker-password", w.priv.Password)
	w.apply(t, "app.yaml", appManifest(w.appV1.digest, 3))
	w.apply(t, "agent.yaml", agentManifest(w.agent.podRef()))
	w.kubectl(t, "rollout", "status", "deployment/app", "--timeout", "180s")
	w.kubectl(t, "rollout", "status", "daemonset/agent", "--timeout", "180s")
	pods := w.requireRunning(t, "app=app", w.appV1.digest, 3)
	nodes := map[string]bool{}
	for _, p := range pods {
		nodes[p.Spec.NodeName] = true
		w.quote(t, "kube-scheduler", 1, "Successfully bound pod", p.Name)
	}
	w.quoteKubelets(t, "Successfully pulled image", w.appV1.digest)
	if len(nodes) != 3 {
		t.Fatalf("app v1 runs on %v: want one replica per node", nodes)
	}
	if pulled := w.events(t, pods, "Pulling"); len(pulled) == 0 {
		t.Fatal("no kubelet pulled app v1: its pods cannot have used the pull secret")
	}
	w.requireRunning(t, "app=agent", w.agent.podRef(), 3)
	// The kubelets' own pulls went to the registry, not through imagepind's mirror: no
	// CRI-O node's store holds v1's own layer (containers/storage keeps no compressed
	// blob); containerd's content store keeps what it pulled.
	for _, n := range w.c.Nodes {
		where := n.Holds(w.appBase)
		t.Logf("%s (%s): v1's own layer %s: %s", n.Name, n.Runtime(), short(w.appBase), cmp.Or(where, "in no store"))
		if n.Containerd == nil && where != "" {
			t.Fatalf("%s: v1's own layer is in imagepind's store: v1 came through the node's mirror, not by the kubelet's own pull", n.Name)
		}
	}

	// What runs, pinned: the set made from the pods (their images by the digest the
	// runtime reports), applied, on every node.
	setV1 := filepath.Join(w.dir, "app-v1.yaml")
	if out, code := imagepinctl(t, "generate", "app-v1", "-n", "default", "-l", "app=app", "--node-selector", "",
		"--kubeconfig", w.c.Admin, "--file", setV1); code != 0 {
		t.Fatalf("imagepinctl generate from the pods: exit %d: %s", code, out)
	}
	b, _ := os.ReadFile(setV1)
	t.Logf("%s:\n%s", setV1, b)
	if !strings.Contains(string(b), w.appV1.digest) {
		t.Fatalf("the set made from the pods does not pin v1 (%s)", w.appV1.digest)
	}
	w.kubectl(t, "apply", "-f", setV1)
	w.kubectl(t, "wait", "--for=condition=Ready", "pis/app-v1", "--timeout=120s")
	// The kubelets pulled v1 with the pods' pull secret: a pod with other credentials
	// would be verified against the registry, so this set may say it is not
	// registry-independent; the scenario needs it Ready on every node only.
	v1st, _ := w.setStatus("app-v1")
	if c := meta.FindStatusCondition(v1st.Conditions, v1alpha1.ConditionRegistryIndependent); c != nil {
		t.Logf("app-v1: %s nodes Ready; RegistryIndependent=%s (%s): %s", v1st.Nodes, c.Status, c.Reason, c.Message)
	}
	w.kubeletsRecordedTheirPulls(t)

	// The next version, prepared: the Deployment paused and its template moved to v2
	// (nothing rolls yet), the set for v2 made from that template, applied, waited for.
	w.kubectl(t, "rollout", "pause", "deployment/app")
	w.kubectl(t, "set", "image", "deployment/app", "app="+w.appV2.podRef())
	time.Sleep(2 * time.Second)
	for _, p := range w.pods(t, "app=app") {
		if p.Spec.Containers[0].Image != w.appV1.digest {
			t.Fatalf("pod %s of the paused Deployment runs %s", p.Name, p.Spec.Containers[0].Image)
		}
	}
	set := filepath.Join(w.dir, "app-v2.yaml")
	if withSetsFromRuns {
		out, code := imagepinctl(t, "generate", "app-v2", "-n", "default", "--deployment", "app", "--node-selector", "",
			"--kubeconfig", w.c.Admin, "--config", w.c.Nodes[0].Config, "--file", set)
		if code != 0 {
			t.Fatalf("imagepinctl generate: exit %d: %s", code, out)
		}
		b, _ := os.ReadFile(set)
		t.Logf("%s:\n%s", set, b)
		if !strings.Contains(string(b), strings.SplitN(w.appV2.digest, "@", 2)[1]) {
			t.Fatalf("the set made from the Deployment's template does not pin v2 (%s)", w.appV2.digest)
		}
		if withTags && !strings.Contains(string(b), "name: "+w.appV2.pinned()+"\n") {
			// The template names the tag: the set must pin it with the digest, so the
			// pods that name it find it on every node with the registry gone.
			t.Fatalf("the set made from the Deployment's template does not pin %s", w.appV2.pinned())
		}
	} else if err := os.WriteFile(set, []byte(setManifest("app-v2", w.appV2.pinned())), 0o644); err != nil {
		t.Fatal(err)
	}
	w.kubectl(t, "apply", "-f", set)
	w.kubectl(t, "wait", "--for=condition=Ready", "pis/app-v2", "--timeout=180s")
	w.kubectl(t, "wait", "--for=condition=RegistryIndependent", "pis/app-v2", "--timeout=60s")
	st := w.waitSetReady(t, "app-v2", 3, 60*time.Second)
	t.Logf("app-v2: %s nodes Ready, %d images, %s", st.Nodes, st.ImagesReady, meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionRegistryIndependent).Message)
	out := w.kubectl(t, "get", "pis")
	if !strings.Contains(out, "app-v2") {
		t.Fatalf("kubectl get pis does not list app-v2:\n%s", out)
	}
	if withTags {
		// The set is Ready once its digests are in; the tag comes after (CRI-O pulls it
		// through the node-local tag endpoint). Until a node holds it, a pod naming the
		// tag pulls (from that endpoint): wait for every node.
		start := time.Now()
		for _, n := range w.c.Nodes {
			waitUntil(t, n.Name+" holding "+w.appV2.tag, 90*time.Second, func() bool {
				_, err := n.Crictl(t.Context(), "inspecti", w.appV2.tag)
				return err == nil
			})
		}
		t.Logf("every node holds %s %s after the set was Ready", w.appV2.tag, time.Since(start).Round(100*time.Millisecond))
	}
	// Each runtime holds v2, pinned, before any pod names it.
	for _, n := range w.c.Nodes {
		st := n.Status()
		s := st.Set("app-v2")
		if s == nil || s.Phase != status.Ready {
			t.Fatalf("%s: imagepind's status of app-v2: %+v", n.Name, s)
		}
		out, err := n.Crictl(t.Context(), "inspecti", w.appV2.digest)
		if err != nil {
			t.Fatalf("%s (%s): crictl inspecti %s: %v\n%s", n.Name, n.Runtime(), w.appV2.digest, err, out)
		}
		if n.CRIO != nil && n.Containerd == nil && !strings.Contains(string(out), `"pinned": true`) {
			t.Fatalf("%s: CRI-O does not say %s is pinned:\n%s", n.Name, w.appV2.digest, out)
		}
	}
}

// (b) Checked on every node, the registry stopped, the Deployment resumed: the rollout
// to v2 completes, every v2 pod Running, and the link to the registry carried nothing.
func (w *wholeCluster) rolloutRegistryGone(t *testing.T) {
	w.verdictsAgainstStores(t)
	fromRegistry := map[string]int64{}
	for _, n := range w.c.Nodes {
		fromRegistry[n.Name] = peerBytesOf(n).FromRegistry
	}
	w.priv.Stop()
	down, requests := w.link.Down.Load(), w.link.Requests.Load()
	start := time.Now()
	w.kubectl(t, "rollout", "resume", "deployment/app")
	w.kubectl(t, "rollout", "status", "deployment/app", "--timeout", "180s")
	w.rolloutGone = time.Since(start)
	pods := w.requireRunning(t, "app=app", w.appV2.podRef(), 3)
	t.Logf("rollout to v2 with the registry gone: %s", w.rolloutGone.Round(100*time.Millisecond))
	for _, p := range pods {
		w.quote(t, "kube-scheduler", 1, "Successfully bound pod", p.Name)
	}
	w.quoteKubelets(t, w.appV2.podRef(), "already present on machine")
	if d := w.link.Down.Load() - down; d != 0 {
		t.Fatalf("%d bytes came from the registry's link during the rollout", d)
	}
	if r := w.link.Requests.Load() - requests; r != 0 {
		t.Logf("%d requests reached the link (refused: the registry is gone)", r)
	}
	if p := w.events(t, pods, "Pulling"); len(p) != 0 {
		t.Fatalf("a kubelet pulled for a v2 pod: %s", p[0].Message)
	}
	pulled := w.events(t, pods, "Pulled")
	for _, e := range pulled {
		t.Logf("event %s/%s on %s: %s", e.InvolvedObject.Name, e.Reason, e.Source.Host, e.Message)
		if !strings.Contains(e.Message, "already present on machine") {
			t.Fatalf("a v2 pod's image was not already present: %s", e.Message)
		}
	}
	if len(pulled) < 3 {
		t.Fatalf("%d Pulled events for 3 v2 pods", len(pulled))
	}
	for _, n := range w.c.Nodes {
		if got := peerBytesOf(n).FromRegistry; got != fromRegistry[n.Name] {
			t.Fatalf("%s: imagepind fetched %d bytes from the registry during the rollout", n.Name, got-fromRegistry[n.Name])
		}
	}
}

// setImages are the images of the scenario's sets.
func (w *wholeCluster) setImages() map[string][]taggedImage {
	return map[string][]taggedImage{"base": {w.pause, w.agent}, "app-v1": {w.appV1}, "app-v2": {w.appV2}}
}

// verdictsAgainstStores asks, before the cut, each set's rollup in the API and
// imagepinctl check --registry-gone on each node whether the registry can go, and holds
// the answers against what the cluster's stores hold: a set said to be
// registry-independent must have every digest its images' pulls fetch held on two nodes
// at least, so that one node lost (step c replaces one) strands none. app-v2 must be
// said ready on every node (the scenario goes on from there); a verdict that says more
// than the stores hold is noted in w.unheld and reported once the test has shown what it
// costs.
func (w *wholeCluster) verdictsAgainstStores(t *testing.T) {
	holders := map[string][]string{} // digest: "node (where)"
	for _, imgs := range w.setImages() {
		for _, img := range imgs {
			for _, d := range img.contents {
				if _, done := holders[d]; done {
					continue
				}
				holders[d] = []string{}
				for _, n := range w.c.Nodes {
					if where := n.Holds(d); where != "" {
						holders[d] = append(holders[d], n.Name+" ("+where+")")
					}
				}
			}
		}
	}
	for _, name := range []string{"base", "app-v1", "app-v2"} {
		said := map[string]bool{} // who said the registry can go
		if st, _ := w.setStatus(name); meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionRegistryIndependent) {
			said["the set's RegistryIndependent condition"] = true
		}
		file, _ := filepath.Abs(filepath.Join(w.dir, name+"-from-api.yaml"))
		os.WriteFile(file, []byte(w.kubectl(t, "get", "pis", name, "-o", "yaml")), 0o644)
		for _, n := range w.c.Nodes {
			out, code := imagepinctl(t, "check", "--registry-gone", "--config", n.Config, file)
			ready := code == 0 && strings.Contains(out, "registry gone: ready")
			if ready {
				said["imagepinctl check --registry-gone on "+n.Name] = true
			} else if name == "app-v2" {
				t.Fatalf("%s: imagepinctl check --registry-gone %s: exit %d before the cut", n.Name, name, code)
			}
		}
		for _, img := range w.setImages()[name] {
			for i, d := range img.contents {
				what := [...]string{"manifest", "config"}[min(i, 1)]
				if i > 1 {
					what = fmt.Sprintf("layer %d", i-1)
				}
				if d == w.appBase {
					what += ", v1's own, v2's base"
				}
				t.Logf("set %s: %s %s %s: held by %d node(s) %v", name, img.tag, what, short(d), len(holders[d]), holders[d])
				if len(holders[d]) < 2 && len(said) > 0 {
					w.unheld = append(w.unheld, fmt.Sprintf("set %s: %s %s %s is held by %d node(s) %v; said registry-independent by %s",
						name, img.tag, what, d, len(holders[d]), holders[d], strings.Join(slices.Sorted(maps.Keys(said)), ", ")))
				}
			}
		}
	}
}

// short is a digest cut for a log line.
func short(d string) string {
	if len(d) > 19 {
		return d[:19] + "…"
	}
	return d
}

func peerBytesOf(n *env.ClusterNode) status.PeerBytes {
	if p := n.Status().Node.Peers; p != nil {
		return *p
	}
	return status.PeerBytes{}
}

// (c) A node is replaced, the registry still gone. node-2 goes (its runtime, containerd,
// is the one whose content store keeps every blob it pulled: what the CRI-O nodes' stores
// hold is then all there is) and its pods are deleted; its replica (one per node: it has
// nowhere to go) waits. A new node joins with the startup taint, and the DaemonSet makes
// no pod for it; the scheduler places nothing there until its sets (v1, v2 and base) are
// Ready from its peers and the taint is gone; then the replica and the agent start there.
func (w *wholeCluster) nodeReplaced(t *testing.T) {
	const gone = "node-2"
	if n := w.c.Node(gone); n == nil || n.Containerd == nil {
		t.Fatalf("%s is not the containerd node", gone)
	}
	if err := w.c.RemoveNode(t.Context(), gone); err != nil {
		t.Fatal(err)
	}
	// The node is dead: its pods go as an administrator deletes them (the pod garbage
	// collector would, after a quarantine).
	w.kubectl(t, "delete", "pods", "-n", "default", "--field-selector", "spec.nodeName="+gone, "--force", "--grace-period=0")
	nodes := watchNodes(t, w.c.CS)
	n, err := w.c.AddNode(t.Context(), env.NodeOptions{Taints: []string{startupTaint + ":NoSchedule"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s replaced by %s (%s)", gone, n.Name, n.Runtime())
	onNode := func() []corev1.Pod {
		l, err := w.c.CS.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	tainted := func() bool {
		node, err := w.c.CS.CoreV1().Nodes().Get(t.Context(), n.Name, metav1.GetOptions{})
		return err != nil || slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == startupTaint })
	}
	setsReady := func() bool {
		st := n.Status()
		for _, s := range []string{"base", "app-v1", "app-v2"} {
			if x := st.Set(s); x == nil || x.Phase != status.Ready {
				return false
			}
		}
		return true
	}
	// Until the taint goes nothing is scheduled there, and it does not go before the
	// node's sets are Ready. Meanwhile the node turns Ready, and the scheduler says why
	// the replica waits (the DaemonSet controller makes no pod for a tainted node).
	heldFor := 15 * time.Second // without the taint's removal: how long the hold is watched
	waiting := map[string]corev1.Pod{}
	// A pod waits for the startup taint when the scheduler's latest word is a taint and
	// the node, Ready, has no taint but that one.
	noteWaiting := func() {
		node, err := w.c.CS.CoreV1().Nodes().Get(t.Context(), n.Name, metav1.GetOptions{})
		if err != nil || !env.NodeReady(node) || len(node.Spec.Taints) != 1 || node.Spec.Taints[0].Key != startupTaint {
			return
		}
		for _, pod := range append(w.pods(t, "app=app"), w.pods(t, "app=agent")...) {
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && strings.Contains(c.Message, "1 node(s) had untolerated taint") {
					if _, seen := waiting[pod.Name]; !seen {
						t.Logf("pod %s waits: %s", pod.Name, c.Message)
					}
					waiting[pod.Name] = pod
				}
			}
		}
	}
	// Three small sets (four images) from two peers: seconds when it works. The bound is
	// what a failure costs.
	const joinBound = 120 * time.Second
	deadline := time.Now().Add(joinBound)
	for {
		noteWaiting()
		if p := onNode(); len(p) > 0 && (tainted() || !setsReady()) {
			t.Fatalf("pod %s was scheduled onto %s while it is tainted or its sets are not Ready", p[0].Name, n.Name)
		}
		if w.joinSetsReady == 0 && setsReady() {
			w.joinSetsReady = time.Since(n.Started)
		}
		if !tainted() || (!withNodeCondition && w.joinSetsReady > 0 && time.Since(n.Started) > w.joinSetsReady+heldFor) {
			break
		}
		if time.Now().After(deadline) {
			w.joinFailed(t, n)
			t.Fatalf("%s after %s: sets Ready %v, tainted %v", n.Name, joinBound, setsReady(), tainted())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := w.c.WaitNodeReady(t.Context(), n.Name, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	p := peerBytesOf(n)
	t.Logf("%s: sets Ready %s after its kubelet started, from its peers: %+v", n.Name, w.joinSetsReady.Round(100*time.Millisecond), p)
	if p.FromRegistry != 0 || p.FromPeers == 0 {
		t.Fatalf("%s: %d bytes from the registry, %d from peers", n.Name, p.FromRegistry, p.FromPeers)
	}
	// The replica waited, and the scheduler said it was the node's taint (its latest
	// reason is in the pod's PodScheduled condition).
	if !withNodeCondition {
		waitUntil(t, "the replaced node's replica waiting for the new node's startup taint alone", 30*time.Second, func() bool {
			noteWaiting()
			return len(waiting) == 1
		})
		// The DaemonSet controller makes no pod for a node whose taint its pods do not
		// tolerate.
		ds, err := w.c.CS.AppsV1().DaemonSets("default").Get(t.Context(), "agent", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ds.Status.DesiredNumberScheduled != 2 {
			t.Fatalf("the agent DaemonSet wants %d pods with %s tainted; want 2", ds.Status.DesiredNumberScheduled, n.Name)
		}
		t.Logf("DaemonSet agent: %d desired, %d ready: none for %s while it is tainted", ds.Status.DesiredNumberScheduled, ds.Status.NumberReady, n.Name)
	} else if len(waiting) == 0 {
		// The taint can go before the kubelet reports the node Ready: then the node's
		// not-ready taint held the pods as long as it.
		t.Logf("%s: the startup taint went before the node was Ready", n.Name)
	}
	for _, p := range waiting {
		w.quote(t, "kube-scheduler", 1, "Unable to schedule pod", p.Name, "untolerated taint")
	}
	if !withNodeCondition {
		t.Logf("%s: nothing scheduled there %s after its sets were Ready: the taint holds", n.Name, heldFor)
		t.Skip("the node condition and the taint's removal are not in this build: the held-back node stays tainted")
	}
	w.joinUntainted = time.Since(n.Started)
	waitUntil(t, "the watch seeing "+n.Name+"'s taint gone", 10*time.Second, func() bool { return !nodes.of(n.Name).untainted.IsZero() })
	w.joinTaintAfterReady = logJoinTimeline(t, n, nodes.of(n.Name))
	node, _ := w.c.CS.CoreV1().Nodes().Get(t.Context(), n.Name, metav1.GetOptions{})
	for _, c := range node.Status.Conditions {
		if string(c.Type) == pinnedImagesReady {
			t.Logf("%s condition %s=%s (%s): %s", n.Name, c.Type, c.Status, c.Reason, c.Message)
		}
	}
	t.Logf("%s: startup taint removed %s after its kubelet started", n.Name, w.joinUntainted.Round(100*time.Millisecond))
	for _, a := range w.c.Aggregators {
		b, _ := os.ReadFile(a.Log)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "startup taint removed") && strings.Contains(l, n.Name) {
				t.Logf("%s: %s", a.Name, l)
			}
		}
	}
	if evs, err := w.c.CS.CoreV1().Events("").List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + n.Name + ",reason=" + taintRemovedEvent}); err == nil {
		for _, e := range evs.Items {
			t.Logf("event Node/%s %s (%s): %s", n.Name, e.Reason, e.Source.Component, e.Message)
		}
	}
	apps := w.requireRunning(t, "app=app", w.appV2.podRef(), 3)
	agents := w.requireRunning(t, "app=agent", w.agent.podRef(), 3)
	var here []corev1.Pod
	for _, p := range append(apps, agents...) {
		if p.Spec.NodeName == n.Name {
			here = append(here, p)
		}
	}
	if len(here) != 2 {
		t.Fatalf("%d pods run on %s, want the replaced node's replica and the agent", len(here), n.Name)
	}
	for _, p := range here {
		w.quote(t, "kube-scheduler", 1, "Successfully bound pod", p.Name)
	}
	if l := n.Kubelet.Lines(w.appV2.podRef(), "already present on machine"); len(l) > 0 {
		t.Logf("%s kubelet: %s", n.Name, l[0])
	}
	if p := w.events(t, here, "Pulling"); len(p) != 0 {
		t.Fatalf("the kubelet on %s pulled: %s", n.Name, p[0].Message)
	}
}

// joinFailed logs why a joining node's sets are not Ready: its sets as its imagepind has
// them, the first lines of its log where no node could send a blob, and the sets' rollup.
func (w *wholeCluster) joinFailed(t *testing.T, n *env.ClusterNode) {
	t.Helper()
	st := n.Status()
	for _, s := range st.Sets {
		t.Logf("%s: set %s %s, %d/%d images", n.Name, s.Name, s.Phase, s.ImagesReady, s.ImagesTotal)
		for _, f := range s.FailedImages {
			t.Logf("%s: set %s: %s %s: %s", n.Name, s.Name, f.Image, f.Reason, f.Error)
		}
	}
	b, _ := os.ReadFile(n.Log)
	found := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "no node could send") && found < 5 {
			t.Logf("%s imagepind: %s", n.Name, l)
			found++
		}
	}
	if found == 0 {
		t.Logf("%s imagepind, no line with \"no node could send\"; its last lines:\n%s", n.Name, tail(string(b), 20))
	}
	if out, err := w.c.Kubectl(t.Context(), "get", "pis", "-o", "wide"); err == nil {
		t.Logf("$ kubectl get pis -o wide\n%s", out)
	}
	for _, name := range []string{"base", "app-v1", "app-v2"} {
		s, _ := w.setStatus(name)
		for _, c := range s.Conditions {
			t.Logf("set %s %s=%s (%s): %s", name, c.Type, c.Status, c.Reason, c.Message)
		}
	}
}

// (d) The control: the same rollout to an image no set pins, registry gone. imagepinctl
// said so beforehand, and the new pod stays in ImagePullBackOff while the v2 pods run on.
func (w *wholeCluster) control(t *testing.T) {
	set := filepath.Join(w.dir, "app-v3.yaml")
	if err := os.WriteFile(set, []byte(setManifest("app-v3", w.appV3.digest)), 0o644); err != nil {
		t.Fatal(err)
	}
	n0 := w.c.Nodes[0]
	if out, code := imagepinctl(t, "check", "--registry-gone", "--config", n0.Config, set); code != 1 || strings.Contains(out, "registry gone: ready") {
		t.Fatalf("imagepinctl check --registry-gone on an image no node holds: exit %d", code)
	}
	before := len(w.pods(t, "app=app"))
	w.kubectl(t, "set", "image", "deployment/app", "app="+w.appV3.tag)
	var v3 corev1.Pod
	waitUntil(t, "a v3 pod in ImagePullBackOff", 120*time.Second, func() bool {
		for _, p := range w.pods(t, "app=app") {
			for _, cs := range p.Status.ContainerStatuses {
				if p.Spec.Containers[0].Image == w.appV3.tag && cs.State.Waiting != nil && cs.State.Waiting.Reason == "ImagePullBackOff" {
					v3 = p
					return true
				}
			}
		}
		return false
	})
	t.Logf("pod %s on %s: %s", v3.Name, v3.Spec.NodeName, v3.Status.ContainerStatuses[0].State.Waiting.Message)
	for _, e := range w.events(t, []corev1.Pod{v3}, "Failed") {
		t.Logf("event %s/%s on %s: %s", e.InvolvedObject.Name, e.Reason, e.Source.Host, e.Message)
		break
	}
	w.quoteKubelets(t, w.appV3.tag, "Failed to pull image")
	w.requireRunning(t, "app=app,pod-template-hash!="+v3.Labels["pod-template-hash"], w.appV2.podRef(), before)
}

// kubeletsRecordedTheirPulls checks, per node, under which key the kubelet recorded its
// own pull of v1 (with the pods' pull secret): what the runtime's CRI PullImage returned.
// The kubelet looks a record up by the image ID (ImageStatus): containerd and CRI-O 1.36
// return that ID, so the kubelet finds the record and v1 is no longer pre-loaded for it;
// CRI-O before 1.36 returns a repository digest, under which the kubelet never finds it.
func (w *wholeCluster) kubeletsRecordedTheirPulls(t *testing.T) {
	t.Helper()
	sup := crioSupport(t)
	for _, n := range w.c.Nodes {
		out, err := n.Crictl(t.Context(), "inspecti", "-o", "json", w.appV1.digest)
		var img struct {
			Status struct {
				ID string `json:"id"`
			} `json:"status"`
		}
		if err != nil || json.Unmarshal(out, &img) != nil || img.Status.ID == "" {
			t.Fatalf("%s: crictl inspecti %s: %v\n%s", n.Name, w.appV1.digest, err, out)
		}
		recs, err := kubelet.ReadPullRecords(n.Kubelet.RootDir())
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for key, rec := range recs.Pulled {
			for name, creds := range rec.CredentialMapping {
				if strings.HasPrefix(w.appV1.digest, name+"@") && len(creds.KubernetesSecrets) > 0 {
					keys = append(keys, key)
				}
			}
		}
		byID := n.Containerd != nil || sup.PullReturnsImageID
		_, found := recs.Pulled[img.Status.ID]
		t.Logf("%s (%s): the kubelet's record of its pull of v1 with the pull secret is keyed %q; v1's image ID is %s: found by the kubelet: %v",
			n.Name, n.Runtime(), keys, img.Status.ID, found)
		switch {
		case len(keys) != 1:
			t.Fatalf("%s: the kubelet's records of its pull of v1 with a secret: %q, want one", n.Name, keys)
		case byID && !found:
			t.Fatalf("%s: the kubelet's record is keyed %q, not by v1's image ID %s", n.Name, keys[0], img.Status.ID)
		case !byID && (found || !strings.Contains(keys[0], "@sha256:")):
			t.Fatalf("%s: CRI-O: the kubelet's record is keyed %q, want a repository digest", n.Name, keys[0])
		}
	}
}
