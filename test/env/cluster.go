package env

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/imagepin/imagepin/api/v1alpha1"
	"github.com/imagepin/imagepin/test/testcerts"
)

// Cluster is a whole Kubernetes cluster on this machine, every part real and of one
// Kubernetes version (hack/kube-deps.sh): etcd, kube-apiserver (Node,RBAC,
// NodeRestriction), kube-controller-manager and kube-scheduler, each with its own
// identity; registered kubelets, each on its own CRI-O or containerd, running
// hostNetwork pods; imagepind on every node (the kubelet's credentials for the API, the
// aggregator for its reports and its peers); and imagepin-aggregator in --cluster mode,
// replicas on a Lease behind one Service-like address. The CRD and the RBAC are
// applied as shipped (packaging/aggregator).
type Cluster struct {
	Dir  string
	Kube *Kube
	// Admin is an admin kubeconfig (system:masters) for kubectl.
	Admin string
	CS    kubernetes.Interface
	Dyn   dynamic.Interface
	// Aggregators are the replicas; AggregatorService the address nodes report to (the
	// first replica that accepts: the leader).
	Aggregators       []*Aggregator
	AggregatorService *Proxy

	mu    sync.Mutex
	Nodes []*ClusterNode

	opts                ClusterOptions
	controllers, sched  *exec.Cmd
	controllersExit     chan struct{}
	schedExit           chan struct{}
	peersCA, aggCA      *testcerts.CA
	aggCert, aggKey     string
	aggKubeconfig       string
	peerPort, nextIndex int
	// madeDirs are the mount points NodeNamespaces made on the host, removed by Stop.
	madeDirs []string
}

// ClusterOptions configures a Cluster.
type ClusterOptions struct {
	// Nodes is how many nodes StartCluster registers (AddNode adds more later);
	// ContainerdNodes are the indexes of those that run containerd instead of CRI-O.
	Nodes           int
	ContainerdNodes []int
	// Bin holds imagepind and imagepin-aggregator.
	Bin string
	// Packaging is the directory of the shipped manifests (namespace.yaml, rbac.yaml).
	Packaging string
	// Insecure registries (host:port) every runtime reaches over plain HTTP.
	Insecure []string
	// Locations maps a source name that does not exist to the registry (host:port,
	// plain HTTP) that stands in for it on every node: a disconnected cluster's view of
	// its source registry (CRIOOptions.Locations; containerd's hosts.toml server).
	Locations map[string]string
	// PauseImage is the runtimes' pause (sandbox) image, by digest.
	PauseImage string
	// PullSecret is each node's pull secret (a docker config.json), as a node's global
	// pull secret is: imagepind pulls with it.
	PullSecret []byte
	// AggregatorReplicas (default 2).
	AggregatorReplicas int
	// NodeNamespaces runs each node's runtime and kubelet in a mount namespace of its own
	// with the node's files at the standard paths of its layout (cluster_nodens.go: a CRI-O
	// node's kubeadm's, a containerd node's k3s's), and starts no imagepind process:
	// imagepind comes as a DaemonSet (the Helm chart).
	NodeNamespaces bool
}

// StartCluster starts the control plane, the aggregators and opts.Nodes nodes under dir,
// and waits until every node is Ready. On error everything started is stopped.
func StartCluster(ctx context.Context, dir string, opts ClusterOptions) (c *Cluster, err error) {
	if opts.AggregatorReplicas == 0 {
		opts.AggregatorReplicas = 2
	}
	for _, b := range []string{"kube-controller-manager", "kube-scheduler", "kubectl", "kubelet"} {
		if _, err := os.Stat(filepath.Join(CacheDir(), b)); err != nil {
			return nil, fmt.Errorf("%s/%s missing: run hack/kube-deps.sh", CacheDir(), b)
		}
	}
	c = &Cluster{Dir: dir, opts: opts}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w\nlogs:\n%s", err, c.LogTails(20))
			c.Stop()
			c = nil
		}
	}()
	kdir := filepath.Join(dir, "kube")
	if err := os.MkdirAll(kdir, 0o755); err != nil {
		return c, err
	}
	if c.Kube, err = StartKube(kdir); err != nil {
		return c, err
	}
	rc := c.Kube.AdminConfig()
	if c.CS, err = kubernetes.NewForConfig(rc); err != nil {
		return c, err
	}
	if c.Dyn, err = dynamic.NewForConfig(rc); err != nil {
		return c, err
	}
	c.Admin = filepath.Join(kdir, "admin.kubeconfig")
	if err := c.Kube.TokenKubeconfig(c.Admin, c.Kube.AdminToken); err != nil {
		return c, err
	}
	if err := c.startControllers(); err != nil {
		return c, err
	}
	if err := c.applyShipped(ctx); err != nil {
		return c, err
	}
	if err := c.startAggregators(ctx); err != nil {
		return c, err
	}
	if c.peersCA, err = testcerts.NewCA(dir, "peers-ca"); err != nil {
		return c, err
	}
	if c.peerPort, err = FreePort(); err != nil {
		return c, err
	}
	for i := range opts.Nodes {
		containerd := false
		for _, j := range opts.ContainerdNodes {
			containerd = containerd || i == j
		}
		if _, err := c.AddNode(ctx, NodeOptions{Containerd: containerd}); err != nil {
			return c, err
		}
	}
	return c, nil
}

// startControllers starts kube-controller-manager and kube-scheduler, each with a client
// certificate of the identity the API server's bootstrap RBAC knows it by.
func (c *Cluster) startControllers() error {
	k := c.Kube
	kubeconfig := func(name, cn string) (string, error) {
		cert, err := k.ClientCA.Client(k.Dir, name, cn, "imagepin-e2e")
		if err != nil {
			return "", err
		}
		path := filepath.Join(k.Dir, name+".kubeconfig")
		return path, k.writeKubeconfig(path, "", fmt.Sprintf("client-certificate: %s\n    client-key: %s", cert, cert))
	}
	cmCfg, err := kubeconfig("kube-controller-manager", "system:kube-controller-manager")
	if err != nil {
		return err
	}
	schedCfg, err := kubeconfig("kube-scheduler", "system:kube-scheduler")
	if err != nil {
		return err
	}
	// Every controller with its own service account's token (as kubeadm runs it); no
	// serving port (nothing here scrapes them), no leader election (one of each).
	c.controllers, c.controllersExit, err = k.run("kube-controller-manager", filepath.Join(CacheDir(), "kube-controller-manager"),
		"--kubeconfig", cmCfg, "--controllers", "*", "--use-service-account-credentials",
		"--service-account-private-key-file", filepath.Join(k.Dir, "sa.key"),
		"--root-ca-file", k.ServerCA.File, "--leader-elect=false", "--secure-port", "0",
		"--node-monitor-period", "2s", "--v", "2")
	if err != nil {
		return err
	}
	c.sched, c.schedExit, err = k.run("kube-scheduler", filepath.Join(CacheDir(), "kube-scheduler"),
		"--kubeconfig", schedCfg, "--leader-elect=false", "--secure-port", "0", "--v", "2")
	if err != nil {
		return err
	}
	// The controller manager is working once its service account controller made the
	// default namespace's account (pods cannot be admitted without it).
	return c.waitFor("the default service account (kube-controller-manager)", 90*time.Second, func() (bool, error) {
		select {
		case <-c.controllersExit:
			return false, fmt.Errorf("kube-controller-manager exited:\n%s", k.LogTail("kube-controller-manager", 20))
		case <-c.schedExit:
			return false, fmt.Errorf("kube-scheduler exited:\n%s", k.LogTail("kube-scheduler", 20))
		default:
		}
		_, err := c.CS.CoreV1().ServiceAccounts("default").Get(context.Background(), "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
}

// applyShipped creates the CRD and applies the shipped namespace and RBAC with kubectl.
func (c *Cluster) applyShipped(ctx context.Context) error {
	crd, err := v1alpha1.CRD()
	if err != nil {
		return err
	}
	if err := Create(ctx, c.Dyn, crd); err != nil {
		return err
	}
	if err := c.waitFor("the PinnedImageSet CRD established", 30*time.Second, func() (bool, error) {
		_, err := c.Dyn.Resource(v1alpha1.GroupVersionResource).List(ctx, metav1.ListOptions{})
		return err == nil, nil
	}); err != nil {
		return err
	}
	for _, f := range []string{"namespace.yaml", "rbac.yaml"} {
		if out, err := c.Kubectl(ctx, "apply", "-f", filepath.Join(c.opts.Packaging, f)); err != nil {
			return fmt.Errorf("kubectl apply -f %s: %w\n%s", f, err, out)
		}
	}
	return nil
}

// Kubectl runs the real kubectl as the cluster's admin.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(CacheDir(), "kubectl"), append([]string{"--kubeconfig", c.Admin}, args...)...)
	return cmd.CombinedOutput()
}

// KubectlCommand is how a test prints a kubectl command it ran (for the runbook).
func KubectlCommand(args ...string) string { return "kubectl " + strings.Join(args, " ") }

// waitFor polls cond every 200 ms until it is true, returns an error, or timeout passes.
func (c *Cluster) waitFor(what string, timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not after %s", what, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Stop stops everything the cluster started, by PID, nodes first (each kubelet's pods
// removed from its runtime before the runtime stops), then the aggregators and the
// control plane.
func (c *Cluster) Stop() {
	c.mu.Lock()
	nodes := c.Nodes
	c.Nodes = nil
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); n.Stop() }()
	}
	wg.Wait()
	for _, a := range c.Aggregators {
		a.Stop()
	}
	if c.AggregatorService != nil {
		c.AggregatorService.Close()
	}
	stopProc(c.sched, c.schedExit)
	stopProc(c.controllers, c.controllersExit)
	c.sched, c.controllers = nil, nil
	if c.Kube != nil {
		c.Kube.Stop()
	}
	for _, d := range slices.Backward(c.madeDirs) {
		os.Remove(d) // only if still empty
	}
	c.madeDirs = nil
}

// LogTails is the end of every component's log, for a failed test.
func (c *Cluster) LogTails(n int) string {
	var b strings.Builder
	if c.Kube != nil {
		for _, name := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			fmt.Fprintf(&b, "--- %s:\n%s\n", name, c.Kube.LogTail(name, n))
		}
	}
	for _, a := range c.Aggregators {
		fmt.Fprintf(&b, "--- %s:\n%s\n", a.Name, logTail(a.Log, n))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, node := range c.Nodes {
		b.WriteString(node.LogTails(n))
	}
	return b.String()
}

// LogLines are the lines of a control plane component's log ("kube-apiserver",
// "kube-controller-manager", "kube-scheduler") that contain every one of the strings.
func (c *Cluster) LogLines(component string, contains ...string) []string {
	b, _ := os.ReadFile(filepath.Join(c.Kube.Dir, component+".log"))
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		ok := line != ""
		for _, s := range contains {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// Node is the cluster node named name (nil if none).
func (c *Cluster) Node(name string) *ClusterNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}
