//go:build e2e

// Package e2e runs imagepind, as a process, against a real registry and a real CRI-O.
// It needs root and hack/e2e-deps.sh; `make test-e2e` runs it.
package e2e

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/crio"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
)

var binDir string

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "e2e: needs root (CRI-O)")
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "imagepin-e2e-bin-")
	if err != nil {
		panic(err)
	}
	binDir = dir
	// The versions this run tests (make test: the current pair; make test-versions: the
	// previous one), as each binary says.
	for _, b := range []string{"crio", "containerd", "kubelet"} {
		line, err := env.VersionLine(b)
		if err != nil {
			line = err.Error()
		}
		fmt.Fprintf(os.Stderr, "e2e: %s: %s\n", b, line)
	}
	for _, cmd := range []string{"imagepind", "imagepinctl", "imagepin-aggregator"} {
		out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, cmd), "github.com/imagepin/imagepin/cmd/"+cmd).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", cmd, err, out)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(binDir)
	os.Exit(code)
}

// world is one test's registry, CRI-O and imagepind.
type world struct {
	t        *testing.T
	dir      string
	reg      *env.Registry
	crio     *env.CRIO
	ctr      *env.Containerd // a containerd world's, instead of crio
	cri      *cri.Client
	setsDir  string
	labels   string
	config   string
	status   string
	daemon   *exec.Cmd
	daemonCh chan struct{}
	// nodeName is [node] name ("": e2e-node).
	nodeName string
}

// worldOptions are the imagepind config keys the tests vary.
type worldOptions struct {
	reload          string // default "signal"
	unpinDelay      string // default "2s"
	pullConcurrency int
	metrics         bool
	// extra is appended to the config (a [report] section, say).
	extra string
	// kubeletConfig is [disk] kubelet_config (default "": none).
	kubeletConfig string
}

// baseWorld creates a world's directories, its registry and its CRI-O config; the
// caller starts CRI-O (as a process or as a unit) and writes imagepind's config.
func baseWorld(t *testing.T) *world {
	t.Helper()
	dir := t.TempDir()
	reg := startRegistry(t, dir)
	return worldOn(t, dir, reg, reg.Host)
}

// startRegistry runs a registry under dir/registry for the test's life.
func startRegistry(t *testing.T, dir string) *env.Registry {
	t.Helper()
	os.MkdirAll(filepath.Join(dir, "registry"), 0o755)
	reg, err := env.StartRegistry(filepath.Join(dir, "registry"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Stop)
	return reg
}

// worldOn is a world in dir using reg (shared by several worlds: the nodes of one
// cluster), its CRI-O configured but not started, trusting the insecure registries.
func worldOn(t *testing.T, dir string, reg *env.Registry, insecure ...string) *world {
	t.Helper()
	w := &world{t: t, dir: dir, reg: reg, setsDir: filepath.Join(dir, "sets.d"), labels: filepath.Join(dir, "node-labels.json"),
		config: filepath.Join(dir, "imagepind.toml"), status: filepath.Join(dir, "run", "status.json")}
	os.MkdirAll(w.setsDir, 0o755)
	var err error
	if w.crio, err = env.NewCRIO(filepath.Join(dir, "crio"), env.CRIOOptions{Insecure: insecure}); err != nil {
		t.Fatal(err)
	}
	return w
}

// newWorld is a world with CRI-O and imagepind as plain child processes.
func newWorld(t *testing.T) *world {
	t.Helper()
	w := baseWorld(t)
	w.run(w.crio.Start, w.crio.Cleanup)
	return w
}

// newWorldWith is a world whose CRI-O has options (mirrors, a small image filesystem),
// started as a plain process; the options may depend on the world's registry host.
func newWorldWith(t *testing.T, options func(registry string) env.CRIOOptions) *world {
	t.Helper()
	w := baseWorld(t)
	opts := options(w.reg.Host)
	opts.Insecure = append(opts.Insecure, w.reg.Host)
	c, err := env.NewCRIO(w.crio.Dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	w.crio = c
	w.run(c.Start, c.Cleanup)
	return w
}

// run starts the world's runtime (its cleanup registered first), and points a CRI
// client and imagepind's config at it.
func (w *world) run(start func(context.Context) error, cleanup func()) {
	w.t.Helper()
	w.t.Cleanup(cleanup)
	if err := start(context.Background()); err != nil {
		w.t.Fatal(err)
	}
	w.dialCRI()
	w.writeConfig(worldOptions{})
}

// socket is the world's runtime's CRI socket.
func (w *world) socket() string {
	if w.ctr != nil {
		return w.ctr.Socket
	}
	return w.crio.Socket
}

func (w *world) dialCRI() {
	var err error
	if w.cri, err = cri.Dial("unix://" + w.socket()); err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { w.cri.Close() })
}

// writeConfig writes imagepind's config for this world.
func (w *world) writeConfig(o worldOptions) {
	w.t.Helper()
	if o.reload == "" {
		o.reload = "signal"
	}
	if o.unpinDelay == "" {
		o.unpinDelay = "2s"
	}
	cfg := fmt.Sprintf(`sets_dir = %q
state_dir = %q
status_file = %q
unpin_delay = %q
[node]
name = %q
labels = {"node-role.kubernetes.io/worker" = ""}
labels_file = %q
[cri]
endpoint = "unix://%s"
pull_secret = %q
pull_concurrency = %d
[crio]
config = %q
config_dir = %q
reload = %q
[disk]
registries_conf = %q
registries_conf_dir = %q
certs_dir = %q
kubelet_config = %q
`, w.setsDir, filepath.Join(w.dir, "state"), w.status, o.unpinDelay, cmp.Or(w.nodeName, "e2e-node"), w.labels, w.socket(), filepath.Join(w.dir, "config.json"),
		o.pullConcurrency, w.crio.Config, w.crio.ConfigDir, o.reload, w.crio.RegistriesConf(), w.crio.RegistriesConfDir(), w.crio.CertsDir(), o.kubeletConfig)
	if w.ctr != nil {
		// [cri] runtime stays auto: imagepind finds containerd by CRI Version.
		cfg += fmt.Sprintf("[containerd]\nconfig_path = %q\n", w.ctr.HostsDir)
	}
	if o.metrics {
		port, err := env.FreePort()
		if err != nil {
			w.t.Fatal(err)
		}
		cfg += fmt.Sprintf("[metrics]\naddress = \"127.0.0.1:%d\"\n", port)
	}
	cfg += o.extra
	if err := os.WriteFile(w.config, []byte(cfg), 0o644); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) startDaemon() {
	w.t.Helper()
	logf, err := os.OpenFile(filepath.Join(w.dir, "imagepind.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		w.t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "imagepind"), "--config", w.config, "--log-level", "debug")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	w.daemon = cmd
	w.daemonCh = make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(w.daemonCh) }()
	w.t.Cleanup(w.stopDaemon)
}

func (w *world) stopDaemon() {
	if w.daemon == nil {
		return
	}
	w.daemon.Process.Signal(os.Interrupt)
	select {
	case <-w.daemonCh:
	case <-time.After(10 * time.Second):
		w.daemon.Process.Kill()
		<-w.daemonCh
	}
	w.daemon = nil
	if w.t.Failed() {
		b, _ := os.ReadFile(filepath.Join(w.dir, "imagepind.log"))
		w.t.Logf("imagepind log:\n%s", tail(string(b), 60))
		if w.ctr != nil {
			w.t.Logf("containerd log:\n%s", w.ctr.LogTail(30))
		} else {
			w.t.Logf("CRI-O log:\n%s", w.crio.LogTail(30))
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// push pushes n distinct single-layer images.
func (w *world) push(prefix string, n int) []string {
	w.t.Helper()
	var refs []string
	for i := 0; i < n; i++ {
		img, err := w.reg.PushRandom(context.Background(), fmt.Sprintf("%s-%d", prefix, i), 1, 64<<10)
		if err != nil {
			w.t.Fatal(err)
		}
		refs = append(refs, img.Ref())
	}
	return refs
}

func (w *world) writeSet(name, content string) {
	w.t.Helper()
	tmp := filepath.Join(w.setsDir, ".tmp-"+name)
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		w.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(w.setsDir, name)); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) readStatus() status.Node {
	n, _ := status.ReadFile(w.status)
	return n
}

func (w *world) waitFor(what string, timeout time.Duration, cond func(status.Node) bool) status.Node {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		n := w.readStatus()
		if cond(n) {
			return n
		}
		select {
		case <-w.daemonCh:
			w.t.Fatalf("imagepind exited while waiting for %s", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
	w.t.Fatalf("timed out after %s waiting for %s; status: %+v", timeout, what, w.readStatus())
	return status.Node{}
}

// image asks the real CRI-O about an image.
func (w *world) image(ref string) cri.Image {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	img, err := w.cri.ImageStatus(ctx, ref)
	if err != nil {
		w.t.Fatalf("image status %s: %v", ref, err)
	}
	return img
}

func (w *world) requirePinned(refs ...string) {
	w.t.Helper()
	for _, r := range refs {
		if img := w.image(r); !img.Present || !img.Pinned {
			w.t.Fatalf("%s: present=%v pinned=%v, want both", r, img.Present, img.Pinned)
		}
	}
}

// livePins is pinned_images as CRI-O has it in effect.
func (w *world) livePins() []string {
	w.t.Helper()
	p, err := crio.NewLiveConfig(w.crio.Socket).PinnedImages(context.Background())
	if err != nil {
		w.t.Fatal(err)
	}
	return p
}

// pins is what the runtime pins: CRI-O's live pinned_images, or the image records
// containerd's CRI plugin has the pinned label on (sorted).
func (w *world) pins() []string {
	w.t.Helper()
	if w.ctr == nil {
		return w.livePins()
	}
	return w.ctr.PinnedRecords(w.t)
}

// requireConfigParses checks every file CRI-O reads parses as TOML.
func (w *world) requireConfigParses() {
	w.t.Helper()
	d := crio.DropIn{MainConfig: w.crio.Config, ConfigDir: w.crio.ConfigDir}
	for _, f := range d.Scan() {
		if f.Err != nil {
			w.t.Fatalf("CRI-O config file does not parse: %s: %v", f.Path, f.Err)
		}
		var v map[string]any
		if _, err := toml.DecodeFile(f.Path, &v); err != nil {
			w.t.Fatalf("%s: %v", f.Path, err)
		}
	}
}

func phaseIs(set string, p status.Phase) func(status.Node) bool {
	return func(n status.Node) bool {
		s := n.Set(set)
		return s != nil && s.Phase == p
	}
}

func alphaSet(name string, refs ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: %s}\nspec:\n  nodeSelector: {matchLabels: {node-role.kubernetes.io/worker: \"\"}}\n  pinnedImages:\n", name)
	for _, r := range refs {
		fmt.Fprintf(&b, "  - %s\n", r)
	}
	return b.String()
}

func v1Set(name, pool string, refs ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nmetadata:\n  name: %s\n  labels: {machineconfiguration.openshift.io/role: %s}\nspec:\n  pinnedImages:\n", name, pool)
	for _, r := range refs {
		fmt.Fprintf(&b, "  - name: %s\n", r)
	}
	return b.String()
}

func contains(list []string, items ...string) bool {
	for _, i := range items {
		if !slices.Contains(list, i) {
			return false
		}
	}
	return true
}

// scrape reads imagepind's /metrics (the address in its config).
func scrape(t *testing.T, w *world) string {
	t.Helper()
	b, _ := os.ReadFile(w.config)
	var cfg struct {
		Metrics struct{ Address string } `toml:"metrics"`
	}
	toml.Decode(string(b), &cfg)
	resp, err := http.Get("http://" + cfg.Metrics.Address + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (w *world) writeLabels(content string) {
	w.t.Helper()
	if err := os.WriteFile(w.labels, []byte(content), 0o644); err != nil {
		w.t.Fatal(err)
	}
}
