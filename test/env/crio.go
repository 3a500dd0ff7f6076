package env

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/imagepin/imagepin/cri"
)

// CacheDir is where hack/e2e-deps.sh leaves CRI-O, pinns and crictl.
func CacheDir() string {
	if d := os.Getenv("IMAGEPIN_CACHE"); d != "" {
		return filepath.Join(d, "bin")
	}
	return "/var/cache/imagepin/bin"
}

// CRIO is a real CRI-O process with everything under Dir.
type CRIO struct {
	Dir       string
	Socket    string
	Config    string // crio.conf
	ConfigDir string // crio.conf.d
	// Enter is a command prefix Start runs it under ("": none), e.g. nsenter into a
	// node's mount namespace (ClusterOptions.NodeNamespaces).
	Enter   []string
	LogFile string
	home    string // $HOME, when set (CRIOOptions.Home)
	cmd     *exec.Cmd
	exited  chan struct{}
}

// CRIOOptions configures CRI-O's environment.
type CRIOOptions struct {
	// Insecure registries (host:port) reached over plain HTTP.
	Insecure []string
	// Mirrors maps a source prefix that does not exist to a registry that does: a
	// disconnected cluster.
	Mirrors map[string]string
	// RootSize, when set ("80m"), puts CRI-O's storage root on a tmpfs of that size: a
	// small image filesystem.
	RootSize string
	// RunContainers makes CRI-O run containers on this machine: runc through
	// test/runcwrap (no hugetlb hierarchy here), and PauseImage as its pause_image (it
	// must be present for every sandbox, even one without an infra container).
	RunContainers bool
	PauseImage    string
	// Locations maps a source that does not exist to the plain-HTTP registry that stands
	// in for it (the registry's location in registries.conf): every pull, by tag or
	// digest, goes there. Unlike a loopback source, CRI-O verifies TLS for such a source,
	// so imagepind gives it the node-local tag endpoint.
	Locations map[string]string
	// Home, when set, is CRI-O's $HOME, its .config/containers/certs.d a link to
	// CertsDir: containers/image reads that certs.d before /etc/containers/certs.d, so a
	// CA imagepind writes into CertsDir (the node-local tag endpoint's) is this CRI-O's
	// alone and the machine's /etc is left alone.
	Home string
}

// NewCRIO writes CRI-O's config into dir; Start runs it.
func NewCRIO(dir string, opts CRIOOptions) (*CRIO, error) {
	bin := CacheDir()
	for _, b := range []string{"crio", "pinns"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, fmt.Errorf("%s/%s missing: run hack/e2e-deps.sh", bin, b)
		}
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		return nil, errors.New("runc missing: run hack/e2e-deps.sh")
	}
	conmon, err := exec.LookPath("conmon")
	if err != nil {
		return nil, errors.New("conmon missing: run hack/e2e-deps.sh")
	}
	c := &CRIO{Dir: dir, Socket: filepath.Join(dir, "crio.sock"), Config: filepath.Join(dir, "crio.conf"),
		ConfigDir: filepath.Join(dir, "crio.conf.d"), LogFile: filepath.Join(dir, "crio.log"), home: opts.Home}
	if c.home != "" {
		if err := os.MkdirAll(filepath.Join(c.home, ".config", "containers"), 0o755); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(c.CertsDir(), 0o755); err != nil {
			return nil, err
		}
		if err := os.Symlink(c.CertsDir(), filepath.Join(c.home, ".config", "containers", "certs.d")); err != nil {
			return nil, err
		}
	}
	for _, d := range []string{c.ConfigDir, filepath.Join(dir, "registries.conf.d"), filepath.Join(dir, "cni"), filepath.Join(dir, "root")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if opts.RootSize != "" {
		if err := syscall.Mount("tmpfs", filepath.Join(dir, "root"), "tmpfs", 0, "size="+opts.RootSize); err != nil {
			return nil, fmt.Errorf("tmpfs for the storage root: %w", err)
		}
	}
	pause := "registry.invalid/pause:latest"
	if len(opts.Insecure) > 0 {
		pause = opts.Insecure[0] + "/pause:latest"
	}
	if opts.PauseImage != "" {
		pause = opts.PauseImage
	}
	if opts.RunContainers {
		wrap := filepath.Join(dir, "runcwrap")
		if err := GoBuild(wrap, "github.com/imagepin/imagepin/test/runcwrap", "-X main.runc="+runc); err != nil {
			return nil, err
		}
		runc = wrap
	}
	conf := fmt.Sprintf(`[crio]
root = "%[1]s/root"
runroot = "%[1]s/runroot"
log_dir = "%[1]s/logs"
version_file = "%[1]s/version"
version_file_persist = ""
clean_shutdown_file = "%[1]s/clean.shutdown"
storage_driver = "overlay"

[crio.api]
listen = "%[2]s"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
default_runtime = "runc"
pinns_path = "%[3]s/pinns"
container_exits_dir = "%[1]s/exits"
container_attach_socket_dir = "%[1]s/attach"
namespaces_dir = "%[1]s/ns"

[crio.runtime.runtimes.runc]
runtime_path = "%[4]s"
monitor_path = "%[5]s"
monitor_cgroup = "pod"

# CRI-O's defaults also configure crun, which these machines lack. A handler that fails
# validation is deleted from CRI-O's runtime map (1.34 to 1.36) on every reload, unsynchronised
# with GET /config and CRI Status walking it: a read at that moment kills CRI-O (see
# crio.ReloadSettle). Nodes have both runtimes; so does this one, crun run by runc.
[crio.runtime.runtimes.crun]
runtime_path = "%[4]s"
monitor_path = "%[5]s"
monitor_cgroup = "pod"

[crio.image]
signature_policy = "%[1]s/policy.json"
pause_image = "%[6]s"

[crio.network]
network_dir = "%[1]s/cni"
plugin_dirs = ["/usr/lib/cni"]

[crio.nri]
enable_nri = false

[crio.metrics]
enable_metrics = false
`, dir, c.Socket, bin, runc, conmon, pause)
	var reg strings.Builder
	reg.WriteString("unqualified-search-registries = []\n")
	for _, h := range opts.Insecure {
		if h != "" {
			fmt.Fprintf(&reg, "\n[[registry]]\nlocation = %q\ninsecure = true\n", h)
		}
	}
	for src, mirror := range opts.Mirrors {
		fmt.Fprintf(&reg, "\n[[registry]]\nprefix = %q\nlocation = %q\n[[registry.mirror]]\nlocation = %q\ninsecure = true\npull-from-mirror = \"digest-only\"\n", src, src, mirror)
	}
	for src, location := range opts.Locations {
		fmt.Fprintf(&reg, "\n[[registry]]\nprefix = %q\nlocation = %q\ninsecure = true\n", src, location)
	}
	files := map[string]string{
		c.Config:                              conf,
		filepath.Join(dir, "registries.conf"): reg.String(),
		filepath.Join(dir, "policy.json"):     `{"default": [{"type": "insecureAcceptAnything"}]}`,
		filepath.Join(dir, "storage.conf"):    fmt.Sprintf("[storage]\ndriver = \"overlay\"\ngraphroot = \"%[1]s/root\"\nrunroot = \"%[1]s/runroot\"\n", dir),
	}
	for p, content := range files {
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// RegistriesConf is the registries.conf CRI-O reads; RegistriesConfDir its drop-ins;
// CertsDir the certs.d it reads (CRI-O's default, /etc/containers/certs.d, unless a test
// writes its own here and points both at it).
func (c *CRIO) RegistriesConf() string    { return filepath.Join(c.Dir, "registries.conf") }
func (c *CRIO) RegistriesConfDir() string { return filepath.Join(c.Dir, "registries.conf.d") }
func (c *CRIO) CertsDir() string          { return filepath.Join(c.Dir, "certs.d") }

// DiskConfig is the [disk] section of an imagepind config that reaches registries as
// this CRI-O does.
func (c *CRIO) DiskConfig() string {
	return fmt.Sprintf("[disk]\nregistries_conf = %q\nregistries_conf_dir = %q\ncerts_dir = %q\nkubelet_config = \"\"\n",
		c.RegistriesConf(), c.RegistriesConfDir(), c.CertsDir())
}

// Start runs CRI-O and waits until it answers CRI.
func (c *CRIO) Start(ctx context.Context) error {
	logf, err := os.OpenFile(c.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := append(slices.Clone(c.Enter), c.Command()...)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), c.Environment()...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start crio: %w", err)
	}
	c.cmd = cmd
	c.exited = make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(c.exited) }()

	if err := c.WaitReady(ctx, c.exited); err != nil {
		c.Stop()
		return err
	}
	return nil
}

// Command is CRI-O's command line; Environment its extra environment.
func (c *CRIO) Command() []string {
	return []string{filepath.Join(CacheDir(), "crio"),
		"--config", c.Config, "--config-dir", c.ConfigDir,
		"--registries-conf", c.RegistriesConf(), "--registries-conf-dir", c.RegistriesConfDir(),
		"--log-level", "info"}
}

// Environment is the environment CRI-O needs beyond the caller's.
func (c *CRIO) Environment() []string {
	env := []string{"CONTAINERS_STORAGE_CONF=" + filepath.Join(c.Dir, "storage.conf")}
	if c.home != "" {
		env = append(env, "HOME="+c.home)
	}
	return env
}

// WaitReady waits until CRI-O answers CRI (exited, if not nil, says it died).
func (c *CRIO) WaitReady(ctx context.Context, exited <-chan struct{}) error {
	return waitCRI(ctx, c.Socket, "crio", exited, c.LogTail)
}

// waitCRI waits up to 30 s until the runtime on socket answers CRI Version; exited (if
// not nil) says it died, and its log's tail goes into the error.
func waitCRI(ctx context.Context, socket, name string, exited <-chan struct{}, logTail func(int) string) error {
	client, err := cri.Dial("unix://" + socket)
	if err != nil {
		return err
	}
	defer client.Close()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("%s exited at start; its log:\n%s", name, logTail(30))
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := client.Version(cctx)
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer within 30s; its log:\n%s", name, logTail(30))
}

// Stop terminates CRI-O (SIGTERM, then SIGKILL).
func (c *CRIO) Stop() {
	stopProc(c.cmd, c.exited)
	c.cmd = nil
}

// Cleanup removes the pods a kubelet left, stops CRI-O, kills any pod monitor (conmon)
// still running from its directory, and unmounts what it left under Dir.
func (c *CRIO) Cleanup() {
	if c.cmd != nil {
		RemovePods(c.Socket)
	}
	c.Stop()
	killLeftovers(c.Dir + "/")
	unmountUnder(c.Dir)
}

// LogTail returns the last n lines of CRI-O's log.
func (c *CRIO) LogTail(n int) string { return logTail(c.LogFile, n) }

// LogContains says whether CRI-O logged s.
func (c *CRIO) LogContains(s string) bool {
	b, _ := os.ReadFile(c.LogFile)
	return strings.Contains(string(b), s)
}

// Root is CRI-O's storage root.
func (c *CRIO) Root() string { return filepath.Join(c.Dir, "root") }

func unmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var mounts []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			mounts = append(mounts, f[4])
		}
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		syscall.Unmount(mounts[i], syscall.MNT_DETACH)
	}
}

// PID is the CRI-O process's (0 when not running).
func (c *CRIO) PID() int {
	if c.cmd == nil || c.cmd.Process == nil {
		return 0
	}
	return c.cmd.Process.Pid
}
