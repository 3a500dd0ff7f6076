//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/imagepin/imagepin/api/v1alpha1"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
	"github.com/imagepin/imagepin/test/testcerts"
)

const nodeName = "e2e-node"

// cluster is a world (registry, CRI-O, imagepind) plus a real kube-apiserver and etcd,
// the CRD and RBAC as shipped, a Node object for the node, and aggregators in --cluster mode.
type cluster struct {
	*world
	kube      *env.Kube
	dyn       dynamic.Interface
	cs        *kubernetes.Clientset
	nodeCert  string
	serverCA  *testcerts.CA
	aggCert   string
	aggKey    string
	aggConfig string // the aggregator's kubeconfig: its service account's token
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	w := baseWorld(t)
	if err := w.crio.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.crio.Cleanup)
	w.dialCRI()
	kdir := filepath.Join(w.dir, "kube")
	os.MkdirAll(kdir, 0o755)
	k, err := env.StartKube(kdir)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{world: w, kube: k}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-apiserver log:\n%s", k.LogTail("kube-apiserver", 20))
		}
		k.Stop()
	})
	rc := k.AdminConfig()
	c.dyn = dynamic.NewForConfigOrDie(rc)
	c.cs = kubernetes.NewForConfigOrDie(rc)

	// The CRD and the RBAC exactly as shipped.
	crd, err := v1alpha1.CRD()
	if err != nil {
		t.Fatal(err)
	}
	c.create(crd)
	waitUntil(t, "the CRD established", 30*time.Second, func() bool {
		_, err := c.sets().List(t.Context(), metav1.ListOptions{})
		return err == nil
	})
	for _, f := range []string{"namespace.yaml", "rbac.yaml"} {
		c.applyFile(filepath.Join("..", "..", "packaging", "aggregator", f))
	}
	c.createNode(nodeName, map[string]string{"node-role.kubernetes.io/worker": ""})

	// The aggregator's identity: its service account's token.
	tok, err := c.cs.CoreV1().ServiceAccounts("imagepin").CreateToken(t.Context(), "imagepin-aggregator",
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.aggConfig = filepath.Join(kdir, "aggregator.kubeconfig")
	if err := k.TokenKubeconfig(c.aggConfig, tok.Status.Token); err != nil {
		t.Fatal(err)
	}
	if c.serverCA, err = testcerts.NewCA(w.dir, "aggregator-ca"); err != nil {
		t.Fatal(err)
	}
	if c.aggCert, c.aggKey, err = c.serverCA.Server(w.dir, "aggregator"); err != nil {
		t.Fatal(err)
	}
	return c
}

func ptr[T any](v T) *T { return &v }

func (c *cluster) sets() dynamic.NamespaceableResourceInterface {
	return c.dyn.Resource(v1alpha1.GroupVersionResource)
}

func (c *cluster) create(u *unstructured.Unstructured) {
	c.t.Helper()
	if err := env.Create(c.t.Context(), c.dyn, u); err != nil {
		c.t.Fatal(err)
	}
}

// applyYAML creates every document of a YAML text, as `kubectl apply -f` would.
func (c *cluster) applyYAML(text string) {
	c.t.Helper()
	if err := env.ApplyYAML(c.t.Context(), c.dyn, []byte(text)); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) applyFile(path string) {
	c.t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		c.t.Fatal(err)
	}
	c.applyYAML(string(b))
}

func (c *cluster) createNode(name string, labels map[string]string) {
	c.t.Helper()
	l := map[string]any{}
	for k, v := range labels {
		l[k] = v
	}
	c.create(&unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": name, "labels": l}}})
}

func (c *cluster) labelNode(name, key string, value *string) {
	c.t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{key: value}}})
	if _, err := c.dyn.Resource(env.Resource("Node")).Patch(c.t.Context(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) deleteNode(name string) {
	c.t.Helper()
	if err := c.dyn.Resource(env.Resource("Node")).Delete(c.t.Context(), name, metav1.DeleteOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// apiSet is a PinnedImageSet document of imagepin's API group.
func apiSet(name, selector string, refs ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: imagepin.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: %s}\nspec:\n  nodeSelector: %s\n  pinnedImages:\n", name, selector)
	for _, r := range refs {
		fmt.Fprintf(&b, "  - name: %s\n", r)
	}
	return b.String()
}

func (c *cluster) setStatus(name string) (v1alpha1.Status, bool) {
	u, err := c.sets().Get(context.Background(), name, metav1.GetOptions{})
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

func readyCondition(st v1alpha1.Status) *metav1.Condition {
	return meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
}

// waitStatus waits for the set's status, read back from the API, to satisfy cond.
func (c *cluster) waitStatus(name, what string, timeout time.Duration, cond func(v1alpha1.Status) bool) v1alpha1.Status {
	c.t.Helper()
	var last v1alpha1.Status
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if st, current := c.setStatus(name); current {
			last = st
			if cond(st) {
				return st
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	b, _ := json.MarshalIndent(last, "", "  ")
	c.t.Fatalf("timed out after %s waiting for %s of %s; status:\n%s", timeout, what, name, b)
	return last
}

func readyN(n, of int) func(v1alpha1.Status) bool {
	return func(st v1alpha1.Status) bool {
		r := readyCondition(st)
		want := metav1.ConditionFalse
		if n == of && of > 0 {
			want = metav1.ConditionTrue
		}
		return r != nil && r.Status == want && st.ReadyNodes == n && st.TargetedNodes == of
	}
}

// startClusterAggregator starts imagepin-aggregator --cluster with the shipped RBAC's
// identity; extra flags (leader election) are appended.
func (c *cluster) startClusterAggregator(name string, extra ...string) *aggregatorProc {
	c.t.Helper()
	gp, _ := env.FreePort()
	hp, _ := env.FreePort()
	client, err := c.serverCA.HTTPClient("")
	if err != nil {
		c.t.Fatal(err)
	}
	// The read side asks the API server about every token: the admin's is allowed by RBAC.
	a := &aggregatorProc{t: c.t, grpcAddr: "127.0.0.1:" + strconv.Itoa(gp), httpURL: "https://127.0.0.1:" + strconv.Itoa(hp),
		log: filepath.Join(c.dir, name+".log"), client: client, token: c.kube.AdminToken}
	a.args = append([]string{"--grpc-address", a.grpcAddr, "--http-address", "127.0.0.1:" + strconv.Itoa(hp),
		"--tls-cert", c.aggCert, "--tls-key", c.aggKey, "--client-ca", c.kube.ClientCA.File,
		"--cluster", "--kubeconfig", c.aggConfig, "--leader-elect-namespace", "imagepin", "--leader-elect-identity", name,
		"--status-min-interval", "1s", "--status-warmup", "3s", "--log-level", "debug"}, extra...)
	a.start()
	c.t.Cleanup(func() {
		if c.t.Failed() {
			b, _ := os.ReadFile(a.log)
			c.t.Logf("%s log:\n%s", name, tail(string(b), 30))
		}
		a.stop()
	})
	return a
}

// startNode writes imagepind's config with [cluster] and [report] and starts it.
func (c *cluster) startNode(apiServer, aggregatorAddr string) {
	c.t.Helper()
	kubeconfig, cert, err := c.kube.NodeKubeconfig(c.dir, nodeName, apiServer)
	if err != nil {
		c.t.Fatal(err)
	}
	c.nodeCert = cert
	c.writeConfig(worldOptions{extra: fmt.Sprintf("[report]\naggregator = %q\nheartbeat = \"1s\"\ncert = %q\nca = %q\n[cluster]\nkubeconfig = %q\n",
		aggregatorAddr, cert, c.serverCA.File, kubeconfig)})
	c.startDaemon()
}

func (c *cluster) clusterFile(set string) string {
	return filepath.Join(c.setsDir, "cluster", set+".json")
}

// kubectlGet asks for the set list as a Table, as `kubectl get pinnedimagesets` does,
// and returns the named row's cells by column name.
func (c *cluster) kubectlGet(name string) map[string]string {
	c.t.Helper()
	rc := c.kube.AdminConfig()
	tr, err := rest.TransportFor(rc)
	if err != nil {
		c.t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", c.kube.URL+"/apis/imagepin.io/v1alpha1/pinnedimagesets", nil)
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	var table metav1.Table
	if err := json.NewDecoder(resp.Body).Decode(&table); err != nil {
		c.t.Fatal(err)
	}
	for _, row := range table.Rows {
		if len(row.Cells) > 0 && row.Cells[0] == name {
			out := map[string]string{}
			for i, col := range table.ColumnDefinitions {
				out[col.Name] = fmt.Sprint(row.Cells[i])
			}
			return out
		}
	}
	c.t.Fatalf("no row %s in the table", name)
	return nil
}

// The cluster loop end to end: kubectl apply → the node pins and pulls → the object's
// status says Ready 1/1; a Node with no imagepind holds the set back as Unknown; a zone
// selector follows the Node's labels both ways; deleting the set unpins it after
// unpin_delay and keeps its images; nothing reboots, nothing is unpinned early.
func TestClusterLoop(t *testing.T) {
	c := newCluster(t)
	agg := c.startClusterAggregator("aggregator", "--leader-elect=false")
	c.startNode("", agg.grpcAddr)

	// Apply a set for the worker pool.
	a := c.push("cl-a", 2)
	c.applyYAML(apiSet("workers", `{matchLabels: {node-role.kubernetes.io/worker: ""}}`, a...))
	c.waitFor("workers Ready on the node", 60*time.Second, phaseIs("workers", status.Ready))
	c.requirePinned(a...)
	if n := c.readStatus(); n.Set("workers").File != "cluster/workers.json" {
		t.Fatalf("the set's file is %q", n.Set("workers").File)
	}
	st := c.waitStatus("workers", "Ready 1/1", 30*time.Second, readyN(1, 1))
	if st.Nodes != "1/1" || st.Progress != "100%" || st.ImagesReady != 2 || len(st.FailingNodes) != 0 {
		t.Fatalf("status %+v", st)
	}
	row := c.kubectlGet("workers")
	if row["Ready"] != "True" || row["Nodes"] != "1/1" || row["Failed"] != "0" || row["Progress"] != "100%" {
		t.Fatalf("kubectl get row %v", row)
	}
	t.Logf("kubectl get pinnedimagesets: %v", row)
	// The node's own pods would start from the set's images with the registry gone, but
	// the one node shares no blob ([peers] off): a node joining would find none of them,
	// and the aggregator says so (a sure False, not True).
	st = c.waitStatus("workers", "RegistryIndependent False: BlobsNotHeld", 2*time.Minute, func(st v1alpha1.Status) bool {
		r := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionRegistryIndependent)
		return r != nil && r.Status == metav1.ConditionFalse && r.Reason == "BlobsNotHeld" &&
			strings.Contains(r.Message, "pinned by no node that shares its blobs ([peers] on), so a node joining or replacing one would find none of their blobs")
	})
	t.Logf("RegistryIndependent: %+v", *meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionRegistryIndependent))

	// A Node with no imagepind behind it: the set is not Ready, that node Unknown.
	c.createNode("ghost-node", map[string]string{"node-role.kubernetes.io/worker": ""})
	st = c.waitStatus("workers", "1/2 with the ghost Unknown", 30*time.Second, readyN(1, 2))
	// The ghost not Ready comes first; the Ready node's own pods start (it is not said
	// to need the registry), and its blobs, shared by no node, are said apart.
	if r := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionRegistryIndependent); r == nil || r.Status != metav1.ConditionFalse || r.Reason != "NotAllNodesReady" ||
		!strings.HasPrefix(r.Message, "1/2 nodes ready: ") || !strings.Contains(r.Message, "; a node joining or replacing one would need the registry: ") ||
		!strings.Contains(r.Message, "pinned by no node that shares its blobs") || strings.Contains(r.Message, "when a pod starts") {
		t.Fatalf("RegistryIndependent with a node not Ready: %+v", r)
	}
	if st.UnknownNodes != 1 || len(st.FailingNodes) != 1 || st.FailingNodes[0].Node != "ghost-node" || st.FailingNodes[0].Reason != "NeverReported" {
		t.Fatalf("status %+v", st)
	}
	if d := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDegraded); d == nil || d.Status != metav1.ConditionTrue || !strings.Contains(d.Message, "ghost-node") {
		t.Fatalf("Degraded %+v", d)
	}
	c.deleteNode("ghost-node")
	c.waitStatus("workers", "Ready 1/1 again", 30*time.Second, readyN(1, 1))

	// A zone selector: the node takes the set when its Node is labelled, lets it go when not.
	b := c.push("cl-zone", 1)
	c.applyYAML(apiSet("zone-b", `{matchLabels: {topology.kubernetes.io/zone: b}}`, b...))
	c.waitStatus("zone-b", "no node targeted", 30*time.Second, func(st v1alpha1.Status) bool {
		r := readyCondition(st)
		return r != nil && r.Reason == "NoNodesTargeted" && st.TargetedNodes == 0
	})
	if n := c.readStatus(); n.Set("zone-b") != nil {
		t.Fatal("zone-b applies before the Node is labelled")
	}
	c.labelNode(nodeName, "topology.kubernetes.io/zone", ptr("b"))
	c.waitFor("zone-b Ready after labelling the Node", 60*time.Second, phaseIs("zone-b", status.Ready))
	c.requirePinned(b...)
	c.waitStatus("zone-b", "Ready 1/1", 30*time.Second, readyN(1, 1))
	c.labelNode(nodeName, "topology.kubernetes.io/zone", nil)
	waitUntil(t, "zone-b unpinned after unpin_delay", 30*time.Second, func() bool { return !c.image(b[0]).Pinned })
	if img := c.image(b[0]); !img.Present {
		t.Fatal("an unpinned image was deleted: imagepind never deletes images")
	}

	// Delete the set: unpinned after unpin_delay, images stay, file gone.
	if err := c.sets().Delete(t.Context(), "workers", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the deleted set's file removed", 10*time.Second, func() bool {
		_, err := os.Stat(c.clusterFile("workers"))
		return os.IsNotExist(err)
	})
	// Not at once: unpin_delay (2s) first.
	if img := c.image(a[0]); !img.Pinned {
		t.Fatal("unpinned before unpin_delay")
	}
	waitUntil(t, "workers unpinned after unpin_delay", 30*time.Second, func() bool { return !c.image(a[0]).Pinned && !c.image(a[1]).Pinned })
	for _, r := range a {
		if !c.image(r).Present {
			t.Fatalf("%s deleted", r)
		}
	}
	c.requireConfigParses()
	if n := c.readStatus(); len(n.Faults) != 0 {
		t.Fatalf("faults: %v", n.Faults)
	}
}

// The API going away costs nothing: with kube-apiserver stopped, imagepind reports the
// fault and unpins nothing; a node cut off while sets change (one updated, one deleted)
// keeps everything, then converges from where its watch left off.
func TestClusterAPIUnreachable(t *testing.T) {
	c := newCluster(t)
	agg := c.startClusterAggregator("aggregator", "--leader-elect=false")
	link, err := env.StartProxy(strings.TrimPrefix(c.kube.URL, "https://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(link.Close)
	c.startNode("https://"+link.Addr, agg.grpcAddr)
	a := c.push("down-a", 1)
	d := c.push("down-d", 1)
	c.applyYAML(apiSet("keep", "{}", a...))
	c.applyYAML(apiSet("drop", "{}", d...))
	c.waitFor("both Ready", 60*time.Second, func(n status.Node) bool {
		return phaseIs("keep", status.Ready)(n) && phaseIs("drop", status.Ready)(n)
	})

	// kube-apiserver stopped: a fault, nothing unpinned (well past unpin_delay).
	c.kube.StopAPIServer()
	c.waitFor("the API fault in the node's status", 60*time.Second, func(n status.Node) bool {
		for _, f := range n.Faults {
			if strings.Contains(f, "cluster API") && strings.Contains(f, "nothing is unpinned") {
				return true
			}
		}
		return false
	})
	time.Sleep(5 * time.Second)
	c.requirePinned(a[0], d[0])
	if _, err := os.Stat(c.clusterFile("drop")); err != nil {
		t.Fatalf("a synced file went while the API was down: %v", err)
	}
	restart := time.Now()
	if err := c.kube.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver answered %s after its start began", time.Since(restart).Round(100*time.Millisecond))
	// The API server answers again: the node's first watch from its old resourceVersion
	// gets 410 Expired. That is not "unreachable", and the node relists within seconds
	// instead of waiting out client-go's backoff grown during the outage (44-68 s before).
	back := time.Now()
	calledUnreachable := ""
	c.waitFor("the fault cleared", 90*time.Second, func(n status.Node) bool {
		for _, f := range n.Faults {
			if strings.Contains(f, "closed at once") {
				calledUnreachable = f
			}
		}
		return len(n.Faults) == 0
	})
	t.Logf("the node followed the API %s after it answered again (%s after its start began)",
		time.Since(back).Round(100*time.Millisecond), time.Since(restart).Round(100*time.Millisecond))
	if took := time.Since(back); took > 20*time.Second {
		t.Errorf("the node followed the API %s after it answered again; want seconds", took)
	}
	if calledUnreachable != "" {
		t.Errorf("an answering API server was reported unreachable: %s", calledUnreachable)
	}

	// Cut the node off, change the sets meanwhile: nothing moves on the node.
	link.Cut()
	c.waitFor("the node sees the API gone", 60*time.Second, func(n status.Node) bool { return len(n.Faults) > 0 })
	a2 := c.push("down-a2", 1)
	u, err := c.sets().Get(t.Context(), "keep", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	unstructured.SetNestedSlice(u.Object, []any{map[string]any{"name": a[0]}, map[string]any{"name": a2[0]}}, "spec", "pinnedImages")
	if _, err := c.sets().Update(t.Context(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.sets().Delete(t.Context(), "drop", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	c.requirePinned(a[0], d[0])
	if c.image(a2[0]).Present {
		t.Fatal("the node acted on a change it cannot have seen")
	}
	// Back: the update is pulled and pinned, the deletion unpinned after unpin_delay.
	link.Restore()
	c.waitFor("keep Ready with its new image", 90*time.Second, func(n status.Node) bool {
		s := n.Set("keep")
		return s != nil && s.Phase == status.Ready && s.ImagesTotal == 2 && n.Set("drop") == nil && len(n.Faults) == 0
	})
	c.requirePinned(a[0], a2[0])
	waitUntil(t, "drop unpinned", 30*time.Second, func() bool { return !c.image(d[0]).Pinned })
	// The aggregator's own informers went through the API server's restart too: client-go's
	// reflector backs off up to about 30 s between retries, so allow for that.
	c.waitStatus("keep", "Ready 1/1 in the API", 90*time.Second, readyN(1, 1))
}

// Two aggregators on a Lease: the leader writes; killed with SIGKILL, the standby takes
// over, nodes reconnect (through a Service-like proxy) and re-send, and the status keeps
// its truth: never a false not-Ready or Degraded on the way, and the new leader writes.
func TestAggregatorTakeover(t *testing.T) {
	c := newCluster(t)
	lease := []string{"--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "500ms"}
	one := c.startClusterAggregator("aggregator-1", lease...)
	two := c.startClusterAggregator("aggregator-2", lease...)
	svc, err := env.StartProxy(one.grpcAddr, two.grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	c.startNode("", svc.Addr)
	a := c.push("ha-a", 1)
	c.applyYAML(apiSet("ha", "{}", a...))
	c.waitStatus("ha", "Ready 1/1", 60*time.Second, readyN(1, 1))

	holder := func() string {
		l, err := c.cs.CoordinationV1().Leases("imagepin").Get(t.Context(), "imagepin-aggregator", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	leader, standby := one, two
	if holder() == "aggregator-2" {
		leader, standby = two, one
	}
	if ready(standby) {
		t.Fatal("the standby says it is ready: the Service would send it reports")
	}
	// SIGKILL: no lease release, the standby must wait the lease out.
	leader.cmd.Process.Signal(syscall.SIGKILL)
	leader.cmd.Wait()
	leader.cmd = nil
	deadline := time.Now().Add(60 * time.Second)
	tookOver := false
	for time.Now().Before(deadline) {
		if st, ok := c.setStatus("ha"); ok {
			r := readyCondition(st)
			deg := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDegraded)
			if r == nil || r.Status != metav1.ConditionTrue || (deg != nil && deg.Status == metav1.ConditionTrue) {
				t.Fatalf("status lost its truth during the takeover: %+v", st)
			}
		}
		if !tookOver && ready(standby) {
			tookOver = true
			t.Logf("standby leading after %s", time.Since(deadline.Add(-60*time.Second)).Round(100*time.Millisecond))
			deadline = time.Now().Add(8 * time.Second) // watch the warm-up and first writes too
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !tookOver {
		t.Fatal("the standby never took over")
	}
	if v, ok := standby.set("ha"); !ok || !v.Ready {
		t.Fatalf("the new leader's rollup: %+v %v", v, ok)
	}
	// The new leader writes: a Node without imagepind shows up in the status.
	c.createNode("ghost-node", nil)
	c.waitStatus("ha", "the new leader counting the ghost", 30*time.Second, readyN(1, 2))
}

func ready(a *aggregatorProc) bool {
	resp, err := a.getAs("/readyz", "")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}
