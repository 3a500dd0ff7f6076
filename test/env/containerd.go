package env

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"

	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/imagepin/imagepin/containerd"
)

// Containerd is a real containerd 2.x process (built by hack/e2e-deps.sh) with
// everything under Dir: its root and state, its socket (CRI and containerd's own API),
// and its registry hosts directory (config_path).
type Containerd struct {
	Dir      string
	Socket   string
	Config   string
	HostsDir string // the CRI plugin's registry config_path
	// Enter is a command prefix Start runs it under ("": none), e.g. nsenter into a
	// node's mount namespace (ClusterOptions.NodeNamespaces).
	Enter   []string
	LogFile string
	cmd     *exec.Cmd
	exited  chan struct{}
}

// ContainerdOptions configures containerd's environment, as CRIOOptions does CRI-O's.
type ContainerdOptions struct {
	// Insecure registries (host:port) reached over plain HTTP.
	Insecure []string
	// Mirrors maps a source that does not exist to a registry that does, as a pull-only
	// (digest) mirror in the source's hosts.toml: a disconnected cluster.
	Mirrors map[string]string
	// RootSize, when set ("80m"), puts containerd's root (content store and
	// snapshots) on a tmpfs of that size.
	RootSize string
	// RunContainers makes containerd run pods on this machine: its runc shim (built
	// beside it by hack/e2e-deps.sh) with runc through test/runcwrap, the sandbox's
	// oom_score_adj kept at or above containerd's own (these machines cannot lower it),
	// and PauseImage as the sandbox image.
	RunContainers bool
	PauseImage    string
}

// NewContainerd writes containerd's config into dir; Start runs it.
func NewContainerd(dir string, opts ContainerdOptions) (*Containerd, error) {
	bin := filepath.Join(CacheDir(), "containerd")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s missing: run hack/e2e-deps.sh", bin)
	}
	// A unix socket path is at most 107 bytes, and containerd's ttrpc socket sits beside
	// the gRPC one: test directories are too deep for them.
	sockDir, err := os.MkdirTemp("", "ctrd-")
	if err != nil {
		return nil, err
	}
	c := &Containerd{Dir: dir, Socket: filepath.Join(sockDir, "containerd.sock"), Config: filepath.Join(dir, "config.toml"),
		HostsDir: filepath.Join(dir, "certs.d"), LogFile: filepath.Join(dir, "containerd.log")}
	for _, d := range []string{c.HostsDir, filepath.Join(dir, "root"), filepath.Join(dir, "cni")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if opts.RootSize != "" {
		if err := syscall.Mount("tmpfs", filepath.Join(dir, "root"), "tmpfs", 0, "size="+opts.RootSize); err != nil {
			return nil, fmt.Errorf("tmpfs for containerd's root: %w", err)
		}
	}
	pause := "registry.invalid/pause:latest"
	if len(opts.Insecure) > 0 {
		pause = opts.Insecure[0] + "/pause:latest"
	}
	if opts.PauseImage != "" {
		pause = opts.PauseImage
	}
	runtime := ""
	if opts.RunContainers {
		if _, err := os.Stat(filepath.Join(CacheDir(), "containerd-shim-runc-v2")); err != nil {
			return nil, fmt.Errorf("%s/containerd-shim-runc-v2 missing: run hack/e2e-deps.sh containerd", CacheDir())
		}
		runc, err := exec.LookPath("runc")
		if err != nil {
			return nil, errors.New("runc missing: run hack/e2e-deps.sh")
		}
		wrap := filepath.Join(dir, "runcwrap")
		if err := GoBuild(wrap, "github.com/imagepin/imagepin/test/runcwrap", "-X main.runc="+runc); err != nil {
			return nil, err
		}
		runtime = fmt.Sprintf(`  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %q
`, wrap)
	}
	conf := fmt.Sprintf(`version = 3
root = "%[1]s/root"
state = "%[1]s/state"

[grpc]
  address = "%[2]s"

[ttrpc]
  address = "%[2]s.ttrpc"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "%[3]s"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "%[4]s"

[plugins.'io.containerd.cri.v1.runtime']
%[5]s  [plugins.'io.containerd.cri.v1.runtime'.cni]
    conf_dir = "%[1]s/cni"
    bin_dirs = ["/usr/lib/cni"]

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.nri.v1.nri']
  disable = true
`, dir, c.Socket, pause, c.HostsDir, runtime)
	if err := os.WriteFile(c.Config, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	for _, h := range opts.Insecure {
		if err := c.WriteHosts(h, fmt.Sprintf("server = \"http://%[1]s\"\n\n[host.\"http://%[1]s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", h)); err != nil {
			return nil, err
		}
	}
	for src, mirror := range opts.Mirrors {
		if err := c.WriteHosts(src, fmt.Sprintf("server = \"https://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\"]\n", src, mirror)); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// WriteHosts writes the hosts.toml of a registry (host:port spelled host_port_, as
// containerd looks for it first).
func (c *Containerd) WriteHosts(registry, content string) error {
	name := registry
	if i := strings.LastIndex(registry, ":"); i > 0 {
		name = registry[:i] + "_" + registry[i+1:] + "_"
	}
	d := filepath.Join(c.HostsDir, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(d, "hosts.toml"), []byte(content), 0o644)
}

// Start runs containerd and waits until it answers CRI.
func (c *Containerd) Start(ctx context.Context) error {
	logf, err := os.OpenFile(c.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := append(slices.Clone(c.Enter), filepath.Join(CacheDir(), "containerd"), "--config", c.Config, "--log-level", "info")
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start containerd: %w", err)
	}
	c.cmd = cmd
	c.exited = make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(c.exited) }()

	if err := waitCRI(ctx, c.Socket, "containerd", c.exited, c.LogTail); err != nil {
		c.Stop()
		return err
	}
	return nil
}

// Stop terminates containerd (SIGTERM, then SIGKILL).
func (c *Containerd) Stop() {
	stopProc(c.cmd, c.exited)
	c.cmd = nil
}

// Cleanup removes the pods a kubelet left, stops containerd, kills any shim still
// running for its socket, and unmounts what it left under Dir (snapshot mounts, the
// tmpfs root).
func (c *Containerd) Cleanup() {
	if c.cmd != nil {
		RemovePods(c.Socket)
	}
	c.Stop()
	killLeftovers(c.Socket) // shims left behind name containerd's socket
	unmountUnder(c.Dir)
	os.RemoveAll(filepath.Dir(c.Socket))
}

// Root is where containerd keeps its content and snapshots.
func (c *Containerd) Root() string { return filepath.Join(c.Dir, "root") }

// LogTail returns the last n lines of containerd's log.
func (c *Containerd) LogTail(n int) string { return logTail(c.LogFile, n) }

// PinnedRecords lists the image records in the k8s.io namespace that carry the CRI
// plugin's pinned label (sorted), asked with containerd's own images API.
func (c *Containerd) PinnedRecords(t interface{ Fatal(...any) }) []string {
	conn, err := grpc.NewClient("unix://"+c.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "containerd-namespace", "k8s.io")
	resp, err := imagesapi.NewImagesClient(conn).List(ctx, &imagesapi.ListImagesRequest{
		Filters: []string{`labels."` + containerd.PinnedLabel + `"==` + containerd.PinnedLabelValue},
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, img := range resp.Images {
		out = append(out, img.Name)
	}
	sort.Strings(out)
	return out
}

// PID is the containerd process's (0 when not running).
func (c *Containerd) PID() int {
	if c.cmd == nil || c.cmd.Process == nil {
		return 0
	}
	return c.cmd.Process.Pid
}
