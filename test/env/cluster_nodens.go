package env

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// A node namespace gives one node of a Cluster the file layout of a real node: its
// runtime and kubelet (and so every container they start) run in a mount namespace of
// their own where the node's files, kept under its Dir, are bind-mounted at the standard
// paths. A hostPath volume of a DaemonSet then names the node's own files on every node,
// as on a cluster of machines. The network stays the host's: every node shares it.
//
// The layouts, the paths the chart's presets name (packaging/helm/imagepin):
//
//	CRI-O (kubeadm's)          containerd (k3s's)
//	/etc/crio                  /run/k3s/containerd/containerd.sock
//	/etc/containers            /var/lib/rancher/k3s/agent/{kubelet.kubeconfig,
//	/run/crio/crio.sock          client-kubelet.crt,.key, serving-kubelet.crt,.key,
//	/etc/kubernetes/kubelet.conf etc/kubelet.conf.d, etc/containerd/certs.d}
//	/var/lib/kubelet/{pki,config.yaml,config.json}   (both: the kubelet's root dir)
//	/var/lib/imagepin                                 (both: imagepind's state)
type nodeNamespace struct {
	holder *exec.Cmd
	exit   chan struct{}
	// enter is the command prefix that runs a process in the namespace.
	enter []string
}

// startNodeNamespace starts a process that holds a new mount namespace (its mounts
// private to the host: nothing mounted in it reaches the host; shared within it).
func startNodeNamespace() (*nodeNamespace, error) {
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "infinity")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start a node's mount namespace: %w", err)
	}
	ns := &nodeNamespace{holder: cmd, exit: make(chan struct{})}
	go func() { cmd.Wait(); close(ns.exit) }()
	self, _ := os.Readlink("/proc/self/ns/mnt")
	path := fmt.Sprintf("/proc/%d/ns/mnt", cmd.Process.Pid)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if l, err := os.Readlink(path); err == nil && l != self {
			break
		}
		if time.Now().After(deadline) {
			ns.stop()
			return nil, fmt.Errorf("a node's mount namespace: %s not made after 5s", path)
		}
	}
	ns.enter = []string{"nsenter", "--mount=" + path, "--"}
	// / shared within the namespace, as systemd makes a real node's: the runtime
	// mounts a host path that holds its own storage's mounts with rslave propagation,
	// which needs a shared or slave source. The host's mounts (private here) are not
	// peers of the namespace's copies: nothing reaches the host still.
	if out, err := exec.Command("nsenter", "--mount="+path, "--", "mount", "--make-rshared", "/").CombinedOutput(); err != nil {
		ns.stop()
		return nil, fmt.Errorf("a node's mount namespace: mount --make-rshared /: %w: %s", err, out)
	}
	return ns, nil
}

// bind mounts src at dst in the namespace; dst must exist on the host (mountPoints).
func (ns *nodeNamespace) bind(src, dst string) error {
	out, err := exec.Command("nsenter", append(ns.enter[1:2], "mount", "--bind", src, dst)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("bind %s at %s in a node's namespace: %w: %s", src, dst, err, out)
	}
	return nil
}

func (ns *nodeNamespace) stop() {
	if ns == nil || ns.holder == nil {
		return
	}
	ns.holder.Process.Kill()
	<-ns.exit
	ns.holder = nil
}

// mountPoints makes the empty directories the layouts bind over on the host, where
// missing, and says which it made (Stop removes them).
func mountPoints(containerd bool) ([]string, error) {
	dirs := []string{"/etc/crio", "/etc/containers", "/run/crio", "/etc/kubernetes", "/var/lib/kubelet", "/var/lib/imagepin"}
	if containerd {
		dirs = []string{"/run/k3s/containerd", "/var/lib/rancher/k3s/agent", "/var/lib/kubelet", "/var/lib/imagepin"}
	}
	var made []string
	for _, d := range dirs {
		// Each missing ancestor too, deepest last, so that Stop removes them in reverse.
		var missing []string
		for p := d; p != "/"; p = filepath.Dir(p) {
			if _, err := os.Lstat(p); err == nil {
				break
			}
			missing = append([]string{p}, missing...)
		}
		for _, p := range missing {
			if err := os.Mkdir(p, 0o755); err != nil && !os.IsExist(err) {
				return made, fmt.Errorf("a node namespace's mount point: %w", err)
			}
			made = append(made, p)
		}
	}
	return made, nil
}

// binds are the node's (source, mount point) pairs of its layout.
type bindMount struct{ src, dst string }

// layOut writes the files of the node's layout under its Dir (copies of the kubelet's
// credentials and config where the layout names them) and returns what to bind where.
func (n *ClusterNode) layOut(c *Cluster) ([]bindMount, error) {
	serving, err := c.peersCA.NodeServing(n.Dir, n.Name+"-kubelet", net.ParseIP(strings.Split(n.PeerAddr, ":")[0]))
	if err != nil {
		return nil, err
	}
	state := filepath.Join(n.Dir, "imagepin")
	files := map[string]string{ // copy of → source
		filepath.Join(n.kroot, "config.yaml"): n.Kubelet.Config,
		filepath.Join(n.kroot, "config.json"): filepath.Join(n.Dir, "config.json"),
		// An aggregator outside the chart: its CA where imagepind can read it.
		filepath.Join(n.kroot, "pki", "imagepin-aggregator-ca.crt"): c.aggCA.File,
	}
	binds := []bindMount{{n.kroot, "/var/lib/kubelet"}, {state, "/var/lib/imagepin"}}
	if n.Containerd != nil {
		agent := filepath.Join(n.Dir, "k3s-agent")
		for f, src := range map[string]string{
			"kubelet.kubeconfig": n.Kubeconfig, "client-kubelet.crt": n.Cert, "client-kubelet.key": n.Cert,
			"serving-kubelet.crt": serving, "serving-kubelet.key": serving,
			"etc/kubelet.conf.d/00-e2e.conf": n.Kubelet.Config,
			// Where a k3s node's pod of the chart can read it (the agent directory is
			// mounted, /var/lib/kubelet/pki is not).
			"imagepin-aggregator-ca.crt": c.aggCA.File,
		} {
			files[filepath.Join(agent, f)] = src
		}
		if err := os.MkdirAll(filepath.Join(agent, "etc", "containerd", "certs.d"), 0o755); err != nil {
			return nil, err
		}
		binds = append(binds, bindMount{filepath.Dir(n.Containerd.Socket), "/run/k3s/containerd"},
			bindMount{agent, "/var/lib/rancher/k3s/agent"},
			bindMount{n.Containerd.HostsDir, "/var/lib/rancher/k3s/agent/etc/containerd/certs.d"})
	} else {
		files[filepath.Join(n.kroot, "pki", "kubelet-client-current.pem")] = n.Cert
		files[filepath.Join(n.kroot, "pki", "kubelet-server-current.pem")] = serving
		files[filepath.Join(n.Dir, "etc-kubernetes", "kubelet.conf")] = n.Kubeconfig
		binds = append(binds, bindMount{n.CRIO.Dir, "/etc/crio"}, bindMount{n.CRIO.Dir, "/etc/containers"},
			bindMount{n.CRIO.Dir, "/run/crio"}, bindMount{filepath.Join(n.Dir, "etc-kubernetes"), "/etc/kubernetes"})
	}
	// The kubeconfig's copy names the certificates where the layout has them, as a real
	// node's does (the originals are under the test's directory, which no pod mounts).
	kubeconfig, clientCert, clientKey, serverCA := filepath.Join(n.Dir, "etc-kubernetes", "kubelet.conf"),
		"/var/lib/kubelet/pki/kubelet-client-current.pem", "/var/lib/kubelet/pki/kubelet-client-current.pem", "/var/lib/kubelet/pki/ca.crt"
	files[filepath.Join(n.kroot, "pki", "ca.crt")] = c.Kube.ServerCA.File
	if n.Containerd != nil {
		agent := filepath.Join(n.Dir, "k3s-agent")
		kubeconfig, clientCert, clientKey, serverCA = filepath.Join(agent, "kubelet.kubeconfig"),
			"/var/lib/rancher/k3s/agent/client-kubelet.crt", "/var/lib/rancher/k3s/agent/client-kubelet.key", "/var/lib/rancher/k3s/agent/server-ca.crt"
		files[filepath.Join(agent, "server-ca.crt")] = c.Kube.ServerCA.File
	}
	for dst, src := range files {
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		if dst == kubeconfig {
			b = []byte(strings.NewReplacer("client-certificate: "+n.Cert, "client-certificate: "+clientCert,
				"client-key: "+n.Cert, "client-key: "+clientKey,
				"certificate-authority: "+c.Kube.ServerCA.File, "certificate-authority: "+serverCA).Replace(string(b)))
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			return nil, err
		}
	}
	return binds, os.MkdirAll(state, 0o755)
}
