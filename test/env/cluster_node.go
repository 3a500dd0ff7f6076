package env

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/imagepin/imagepin/status"
)

// ClusterNode is one node of a Cluster: its runtime (CRI-O or containerd), its
// registered kubelet and its imagepind, everything under Dir.
type ClusterNode struct {
	Name       string
	Index      int
	Dir        string
	CRIO       *CRIO       // nil on a containerd node
	Containerd *Containerd // nil on a CRI-O node
	Kubelet    *Kubelet
	// Kubeconfig and Cert are the node's credentials (CN system:node:<name>), the
	// kubelet's and imagepind's alike.
	Kubeconfig, Cert string
	// Config is imagepind's config, StatusFile its status file, Log its log.
	Config, StatusFile, Log string
	// PeerAddr is where its imagepind serves peers (127.0.0.<2+index>).
	PeerAddr string
	// Started is when its kubelet started (the node registers right after).
	Started time.Time

	kroot  string
	ns     *nodeNamespace // ClusterOptions.NodeNamespaces
	daemon *exec.Cmd
	exit   chan struct{}
}

// NodeOptions configures a node added to a Cluster.
type NodeOptions struct {
	// Containerd runs the node on containerd instead of CRI-O.
	Containerd bool
	// Taints are the kubelet's registerWithTaints (key[=value]:Effect): a node that
	// joins held back.
	Taints []string
	// NoPeers leaves [peers] off: the node pulls everything from the registry.
	NoPeers bool
}

// loopbackCNI makes a runtime report NetworkReady (a registered kubelet's Node is not
// Ready otherwise) without giving pods any network: they run with hostNetwork.
const loopbackCNI = `{"cniVersion": "1.0.0", "name": "hostonly", "plugins": [{"type": "loopback"}]}`

// AddNode starts a node (runtime, registered kubelet, imagepind) named node-<index>; it
// returns once the kubelet runs and imagepind started. WaitNodeReady waits for the Node.
func (c *Cluster) AddNode(ctx context.Context, o NodeOptions) (*ClusterNode, error) {
	c.mu.Lock()
	i := c.nextIndex
	c.nextIndex++
	c.mu.Unlock()
	n := &ClusterNode{Name: fmt.Sprintf("node-%d", i), Index: i, Dir: filepath.Join(c.Dir, fmt.Sprintf("n%d", i))}
	n.Config, n.StatusFile, n.Log = filepath.Join(n.Dir, "imagepind.toml"), filepath.Join(n.Dir, "run", "status.json"), filepath.Join(n.Dir, "imagepind.log")
	n.PeerAddr = fmt.Sprintf("127.0.0.%d:%d", 2+i, c.peerPort)
	c.mu.Lock()
	c.Nodes = append(c.Nodes, n)
	c.mu.Unlock()
	for _, d := range []string{"sets.d", "kubelet"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	var enter []string
	if c.opts.NodeNamespaces {
		made, err := mountPoints(o.Containerd)
		c.mu.Lock()
		c.madeDirs = append(c.madeDirs, made...)
		c.mu.Unlock()
		if err != nil {
			return nil, err
		}
		if n.ns, err = startNodeNamespace(); err != nil {
			return nil, err
		}
		enter = n.ns.enter
	}
	if err := n.startRuntime(ctx, c.opts, o.Containerd, enter); err != nil {
		return nil, err
	}
	var err error
	if n.Kubeconfig, n.Cert, err = c.Kube.NodeKubeconfig(n.Dir, n.Name, ""); err != nil {
		return nil, err
	}
	// Short: the kubelet's sockets live under its root directory.
	if n.kroot, err = os.MkdirTemp("", "kl-"); err != nil {
		return nil, err
	}
	if n.Kubelet, err = NewKubeletWith(filepath.Join(n.Dir, "kubelet"), n.Socket(), KubeletOptions{
		GC:      KubeletGC{HighThresholdPercent: 90, LowThresholdPercent: 80, EvictionImagefsAvailable: "1Gi"},
		RootDir: n.kroot, Kubeconfig: n.Kubeconfig, RegisterWithTaints: o.Taints, Verbosity: 3,
	}); err != nil {
		return nil, err
	}
	if err := n.writeImagepindConfig(c, !o.NoPeers); err != nil {
		return nil, err
	}
	if n.ns != nil {
		binds, err := n.layOut(c)
		if err != nil {
			return nil, err
		}
		for _, b := range binds {
			if err := n.ns.bind(b.src, b.dst); err != nil {
				return nil, err
			}
		}
		n.Kubelet.Enter = n.ns.enter
	}
	n.Started = time.Now()
	if err := n.Kubelet.Start(n.Name); err != nil {
		return nil, err
	}
	if n.ns == nil {
		if err := n.startImagepind(c.opts.Bin); err != nil {
			return nil, err
		}
	}
	if len(o.Taints) == 0 {
		return n, c.WaitNodeReady(ctx, n.Name, 120*time.Second)
	}
	return n, nil
}

func (n *ClusterNode) startRuntime(ctx context.Context, o ClusterOptions, containerd bool, enter []string) error {
	// A CRI-O configuration also on a containerd node: its registries files are what
	// imagepind's [disk] reads there (nothing else uses them).
	var err error
	if n.CRIO, err = NewCRIO(filepath.Join(n.Dir, "crio"), CRIOOptions{Insecure: o.Insecure, RunContainers: !containerd, PauseImage: o.PauseImage,
		Locations: o.Locations, Home: filepath.Join(n.Dir, "crio-home")}); err != nil {
		return err
	}
	cni := filepath.Join(n.CRIO.Dir, "cni")
	if containerd {
		if n.Containerd, err = NewContainerd(filepath.Join(n.Dir, "containerd"), ContainerdOptions{Insecure: o.Insecure, RunContainers: true, PauseImage: o.PauseImage}); err != nil {
			return err
		}
		cni = filepath.Join(n.Containerd.Dir, "cni")
		for src, location := range o.Locations {
			if err := n.Containerd.WriteHosts(src, fmt.Sprintf("server = \"http://%s\"\n", location)); err != nil {
				return err
			}
		}
	}
	if err := os.WriteFile(filepath.Join(cni, "10-hostonly.conflist"), []byte(loopbackCNI), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(n.Dir, "config.json"), o.PullSecret, 0o600); err != nil {
		return err
	}
	if containerd {
		n.Containerd.Enter = enter
		return n.Containerd.Start(ctx)
	}
	n.CRIO.Enter = enter
	return n.CRIO.Start(ctx)
}

// Socket is the node's CRI socket.
func (n *ClusterNode) Socket() string {
	if n.Containerd != nil {
		return n.Containerd.Socket
	}
	return n.CRIO.Socket
}

// Runtime names the node's runtime.
func (n *ClusterNode) Runtime() string {
	if n.Containerd != nil {
		return "containerd"
	}
	return "cri-o"
}

func (n *ClusterNode) writeImagepindConfig(c *Cluster, peers bool) error {
	serving, err := c.peersCA.NodeServing(n.Dir, n.Name, net.ParseIP(strings.Split(n.PeerAddr, ":")[0]))
	if err != nil {
		return err
	}
	mport, err := FreePort()
	if err != nil {
		return err
	}
	tport, err := FreePort()
	if err != nil {
		return err
	}
	cfg := fmt.Sprintf(`sets_dir = %q
state_dir = %q
status_file = %q
unpin_delay = "2s"
[node]
name = %q
labels_file = %q
[cri]
endpoint = "unix://%s"
pull_secret = %q
[crio]
config = %q
config_dir = %q
reload = "signal"
[disk]
registries_conf = %q
registries_conf_dir = %q
certs_dir = %q
kubelet_config = %q
[kubelet]
config_dir = ""
root_dir = %q
[report]
aggregator = %q
heartbeat = "1s"
cert = %q
ca = %q
[cluster]
kubeconfig = %q
`, filepath.Join(n.Dir, "sets.d"), filepath.Join(n.Dir, "state"), n.StatusFile, n.Name, filepath.Join(n.Dir, "node-labels.json"),
		n.Socket(), filepath.Join(n.Dir, "config.json"), n.CRIO.Config, n.CRIO.ConfigDir,
		n.CRIO.RegistriesConf(), n.CRIO.RegistriesConfDir(), n.CRIO.CertsDir(), n.Kubelet.Config, n.kroot,
		c.AggregatorService.Addr, n.Cert, c.aggCA.File, n.Kubeconfig)
	if peers {
		// Its peers are the nodes the aggregator knows to pin the same sets.
		cfg += fmt.Sprintf(`[peers]
enabled = true
mirror_address = "127.0.0.1:%d"
tag_address = "127.0.0.1:%d"
address = %q
cert = %q
ca = %q
client_cert = %q
client_ca = %q
`, mport, tport, n.PeerAddr, serving, c.peersCA.File, n.Cert, c.Kube.ClientCA.File)
	}
	if n.Containerd != nil {
		cfg += fmt.Sprintf("[containerd]\nconfig_path = %q\n", n.Containerd.HostsDir)
	}
	return os.WriteFile(n.Config, []byte(cfg), 0o644)
}

func (n *ClusterNode) startImagepind(bin string) error {
	logf, err := os.OpenFile(n.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(bin, "imagepind"), "--config", n.Config, "--log-level", "debug")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start imagepind on %s: %w", n.Name, err)
	}
	n.daemon, n.exit = cmd, make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(n.exit) }()
	return nil
}

// Status is imagepind's status file on the node (empty when not written yet).
func (n *ClusterNode) Status() status.Node {
	s, _ := status.ReadFile(n.StatusFile)
	return s
}

// Crictl runs crictl against the node's runtime and returns its standard output (its
// standard error, on failure, in the error).
func (n *ClusterNode) Crictl(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(CacheDir(), "crictl"), append([]string{"--runtime-endpoint", "unix://" + n.Socket()}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("crictl %s on %s: %w: %s", strings.Join(args, " "), n.Name, err, stderr.String())
	}
	return out, nil
}

// Stop stops imagepind, the kubelet (its pods removed from the runtime) and the runtime.
func (n *ClusterNode) Stop() {
	if n.daemon != nil {
		n.daemon.Process.Signal(os.Interrupt)
		select {
		case <-n.exit:
		case <-time.After(10 * time.Second):
			n.daemon.Process.Kill()
			<-n.exit
		}
		n.daemon = nil
	}
	if n.Kubelet != nil {
		n.Kubelet.Stop()
	}
	if n.Containerd != nil {
		n.Containerd.Cleanup()
	}
	if n.CRIO != nil {
		n.CRIO.Cleanup()
	}
	n.ns.stop()
	if n.kroot != "" {
		os.RemoveAll(n.kroot)
	}
}

// RemoveNode stops a node and deletes its Node object, as a node taken out of the
// cluster.
func (c *Cluster) RemoveNode(ctx context.Context, name string) error {
	c.mu.Lock()
	var n *ClusterNode
	for i, x := range c.Nodes {
		if x.Name == name {
			n = x
			c.Nodes = append(c.Nodes[:i:i], c.Nodes[i+1:]...)
			break
		}
	}
	c.mu.Unlock()
	if n == nil {
		return fmt.Errorf("no node %s", name)
	}
	n.Stop()
	if err := c.CS.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete Node %s: %w", name, err)
	}
	return nil
}

// LogTails is the end of the node's logs.
func (n *ClusterNode) LogTails(lines int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "--- %s imagepind:\n%s\n", n.Name, logTail(n.Log, lines))
	if n.Kubelet != nil {
		fmt.Fprintf(&b, "--- %s kubelet:\n%s\n", n.Name, n.Kubelet.LogTail(lines))
	}
	if n.Containerd != nil {
		fmt.Fprintf(&b, "--- %s containerd:\n%s\n", n.Name, n.Containerd.LogTail(lines))
	} else if n.CRIO != nil {
		fmt.Fprintf(&b, "--- %s CRI-O:\n%s\n", n.Name, n.CRIO.LogTail(lines))
	}
	return b.String()
}

// WaitNodeReady waits until the Node exists and its Ready condition is True.
func (c *Cluster) WaitNodeReady(ctx context.Context, name string, timeout time.Duration) error {
	return c.waitFor("Node "+name+" Ready", timeout, func() (bool, error) {
		if n := c.Node(name); n != nil && n.Kubelet.Exited() {
			return false, fmt.Errorf("the kubelet exited:\n%s", n.Kubelet.LogTail(30))
		}
		node, err := c.CS.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, nil // the API is busy: ask again
		}
		return NodeReady(node), nil
	})
}

// NodeReady says whether the Node's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Holds says where the node keeps a copy of digest that it can send its peers: imagepind's
// store ("store", on CRI-O the only place: containers/storage keeps no compressed blob),
// or containerd's content store ("containerd"); "" when neither holds it.
func (n *ClusterNode) Holds(digest string) string {
	alg, hex, ok := strings.Cut(digest, ":")
	if !ok {
		return ""
	}
	// [peers] store_dir is not set: <state_dir>/blobs, a content store whose blobs are
	// blobs/<algorithm>/<hex>.
	if _, err := os.Stat(filepath.Join(n.Dir, "state", "blobs", "blobs", alg, hex)); err == nil {
		return "store"
	}
	if n.Containerd != nil {
		if _, err := os.Stat(filepath.Join(n.Containerd.Root(), "io.containerd.content.v1.content", "blobs", alg, hex)); err == nil {
			return "containerd"
		}
	}
	return ""
}
