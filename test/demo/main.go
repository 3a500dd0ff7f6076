// Command demo is `make demo`: a local registry with a few sample images, a real CRI-O
// (or, with RUNTIME=containerd, a real containerd), and imagepind pinning and
// pre-loading a sample set, with its progress and final status printed. Then the proof
// (proof.go): the kubelet-style image GC leaves the pinned images, the registry is
// stopped, a pinned image deleted behind imagepind's back comes back from the node-local
// mirror (CRI-O), and a pod starts from it, each step checked (a failed check exits
// non-zero). Everything runs under a temporary directory and is removed at the end;
// every process is stopped by the PID (or pod ID) the demo started.
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/imagepin/imagepin/containerd"
	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/crio"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "demo: FAILED:", err)
		os.Exit(1)
	}
	fmt.Printf("==> demo finished in %s\n", time.Since(start).Round(time.Second))
}

func step(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

// demo is what the steps share.
type demo struct {
	dir, bin   string
	cfgPath    string
	statusFile string
	reg        *env.Registry
	crio       *env.CRIO
	ctr        *env.Containerd
	socket     string
	client     *cri.Client
	crictl     crictl
	metrics    string // imagepind's metrics address
	daemonLog  string
	daemon     *os.Process // imagepind, which the demo started: reloaded by its PID
	cleanupPod func()      // set once a pod runs: stops and removes it by its ID

	refs     []string // the pinned set, in order
	names    map[string]string
	payments string // runnable, pinned: deleted behind imagepind's back, then run
	pause    string // the sandbox image (pinned too)
	loose    string // an unpinned image
}

func run(ctx context.Context) error {
	bin := os.Getenv("IMAGEPIN_BIN")
	if bin == "" {
		return fmt.Errorf("IMAGEPIN_BIN (the directory with imagepind and imagepinctl) is not set; run make demo")
	}
	dir, err := os.MkdirTemp("", "imagepin-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	d := &demo{dir: dir, bin: bin, names: map[string]string{}}

	step("starting a local registry")
	os.MkdirAll(filepath.Join(dir, "registry"), 0o755)
	if d.reg, err = env.StartRegistry(filepath.Join(dir, "registry")); err != nil {
		return err
	}
	defer d.reg.Stop()
	fmt.Printf("    docker-registry pid %d on %s\n", d.reg.PID(), d.reg.Host)

	// podapp: a static binary that logs a line and sleeps, the entrypoint of the
	// runnable images (the pod at the end, and the sandbox image).
	app := filepath.Join(dir, "podapp")
	if err := env.GoBuild(app, "github.com/imagepin/imagepin/test/podapp", "-s -w"); err != nil {
		return err
	}
	step("pushing sample images to %s (shared base layer, distinct app layers)", d.reg.Host)
	base, err := env.RandomLayer(512 << 10)
	if err != nil {
		return err
	}
	show := func(img env.Image, note string) {
		fmt.Printf("    %s (%d KiB compressed)%s\n", img.Ref(), img.Size>>10, note)
	}
	for _, name := range []string{"openshift/etcd", "openshift/kube-apiserver", "openshift/ovn-kubernetes"} {
		img, err := d.reg.PushRandom(ctx, name, 2, 256<<10, base)
		if err != nil {
			return err
		}
		d.add(name, img.Ref())
		show(img, "")
	}
	pause, err := d.reg.PushRunnable(ctx, "openshift/pod", app)
	if err != nil {
		return err
	}
	d.pause = d.add("openshift/pod", pause.Ref())
	show(pause, "  the pod sandbox (pause) image")
	own, err := env.RandomLayer(256 << 10)
	if err != nil {
		return err
	}
	payments, err := d.reg.PushRunnableWith(ctx, "acme/payments", app, own)
	if err != nil {
		return err
	}
	d.payments = d.add("acme/payments", payments.Ref())
	show(payments, "  runnable")
	loose, err := d.reg.PushRandom(ctx, "acme/debug-tools", 1, 256<<10)
	if err != nil {
		return err
	}
	d.loose = loose.Ref()
	d.names[d.loose] = "acme/debug-tools"
	show(loose, "  NOT pinned")

	setsDir := filepath.Join(dir, "sets.d")
	os.MkdirAll(setsDir, 0o755)
	d.statusFile = filepath.Join(dir, "status.json")
	port, err := env.FreePort()
	if err != nil {
		return err
	}
	d.metrics = fmt.Sprintf("127.0.0.1:%d", port)
	cfg := fmt.Sprintf(`sets_dir = %q
state_dir = %q
status_file = %q
[node]
name = "demo-worker-0"
labels = {"node-role.kubernetes.io/worker" = ""}
labels_file = %q
[metrics]
address = %q
`, setsDir, filepath.Join(dir, "state"), d.statusFile, filepath.Join(dir, "labels.json"), d.metrics)
	switch runtime := os.Getenv("RUNTIME"); runtime {
	case "", "cri-o", "crio":
		step("starting CRI-O %s (from %s)", runtimeVersion("crio"), env.CacheDir())
		if d.crio, err = env.NewCRIO(filepath.Join(dir, "crio"), env.CRIOOptions{Insecure: []string{d.reg.Host}, RunContainers: true, PauseImage: d.pause}); err != nil {
			return err
		}
		if err := d.crio.Start(ctx); err != nil {
			return err
		}
		defer d.crio.Cleanup()
		fmt.Printf("    crio pid %d\n", d.crio.PID())
		d.socket = d.crio.Socket
		mirrorPort, err := env.FreePort()
		if err != nil {
			return err
		}
		cfg += fmt.Sprintf("[cri]\nendpoint = \"unix://%s\"\n[crio]\nconfig = %q\nconfig_dir = %q\nreload = \"signal\"\n", d.crio.Socket, d.crio.Config, d.crio.ConfigDir) + d.crio.DiskConfig()
		// The node-local mirror (docs/peers.md): CRI-O pulls pinned images through
		// imagepind, which keeps their compressed blobs (CRI-O keeps none).
		cfg += fmt.Sprintf("[peers]\nenabled = true\nmirror_address = \"127.0.0.1:%d\"\n", mirrorPort)
	case "containerd":
		step("starting containerd %s (from %s)", runtimeVersion("containerd"), env.CacheDir())
		if d.ctr, err = env.NewContainerd(filepath.Join(dir, "containerd"), env.ContainerdOptions{Insecure: []string{d.reg.Host}, RunContainers: true, PauseImage: d.pause}); err != nil {
			return err
		}
		if err := d.ctr.Start(ctx); err != nil {
			return err
		}
		defer d.ctr.Cleanup()
		fmt.Printf("    containerd pid %d\n", d.ctr.PID())
		d.socket = d.ctr.Socket
		// [cri] runtime stays "auto": imagepind asks CRI Version and finds containerd.
		cfg += fmt.Sprintf("[cri]\nendpoint = \"unix://%s\"\n[containerd]\nconfig_path = %q\n", d.ctr.Socket, d.ctr.HostsDir)
	default:
		return fmt.Errorf("RUNTIME=%q: cri-o or containerd", runtime)
	}
	d.crictl = crictl{bin: filepath.Join(env.CacheDir(), "crictl"), endpoint: "unix://" + d.socket}
	if _, err := os.Stat(d.crictl.bin); err != nil {
		return fmt.Errorf("%s missing: run hack/e2e-deps.sh", d.crictl.bin)
	}
	d.cfgPath = filepath.Join(dir, "imagepind.toml")
	if err := os.WriteFile(d.cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}

	d.daemonLog = filepath.Join(dir, "imagepind.log")
	step("starting imagepind (log: %s)", d.daemonLog)
	logf, _ := os.Create(d.daemonLog)
	daemon := exec.CommandContext(ctx, filepath.Join(bin, "imagepind"), "--config", d.cfgPath)
	daemon.Stdout, daemon.Stderr = logf, logf
	if err := daemon.Start(); err != nil {
		return err
	}
	defer func() { daemon.Process.Signal(os.Interrupt); daemon.Wait() }()
	fmt.Printf("    imagepind pid %d\n", daemon.Process.Pid)
	d.daemon = daemon.Process
	// Runs before the runtime stops (deferred later, so earlier).
	defer func() {
		if d.cleanupPod != nil {
			d.cleanupPod()
		}
	}()

	var set strings.Builder
	set.WriteString(`apiVersion: machineconfiguration.openshift.io/v1
kind: PinnedImageSet
metadata:
  name: upgrade-workers
  labels: {machineconfiguration.openshift.io/role: worker}
spec:
  pinnedImages:
`)
	for _, r := range d.refs {
		fmt.Fprintf(&set, "  - name: %s\n", r)
	}
	step("dropping sets.d/upgrade-workers.yaml (%d images)", len(d.refs))
	fmt.Print(indent(set.String()))
	tmp := filepath.Join(setsDir, ".upgrade-workers.yaml.tmp")
	os.WriteFile(tmp, []byte(set.String()), 0o644)
	os.Rename(tmp, filepath.Join(setsDir, "upgrade-workers.yaml"))

	step("waiting for the set to be Ready")
	readyStart := time.Now()
	if err := d.waitReady(2*time.Minute, nil); err != nil {
		return err
	}
	fmt.Printf("    Ready %s after the set was dropped\n", time.Since(readyStart).Round(100*time.Millisecond))

	d.imagepinctlStatus()

	if d.client, err = cri.Dial("unix://" + d.socket); err != nil {
		return err
	}
	defer d.client.Close()
	if d.crio != nil {
		step("what CRI-O has: its live pinned_images and each image's CRI status")
		pins, err := crio.NewLiveConfig(d.crio.Socket).PinnedImages(ctx)
		if err != nil {
			return err
		}
		for _, p := range pins {
			fmt.Printf("    pinned_images: %s\n", p)
		}
	} else {
		step("what containerd has: each image's CRI status and the records carrying the pinned label")
	}
	for _, r := range d.refs {
		img, err := d.client.ImageStatus(ctx, r)
		if err != nil {
			return err
		}
		fmt.Printf("    %-100s present=%v pinned=%v\n", r, img.Present, img.Pinned)
		if !img.Present || !img.Pinned {
			return fmt.Errorf("the set is Ready but %s is present=%v pinned=%v", r, img.Present, img.Pinned)
		}
	}
	if d.crio != nil {
		dropIn, _ := os.ReadFile(filepath.Join(d.crio.ConfigDir, crio.ManagedFileName))
		step("the managed drop-in %s", crio.ManagedFileName)
		fmt.Print(indent(string(dropIn)))
	} else {
		images, err := containerd.DialImages(d.ctr.Socket, "k8s.io")
		if err != nil {
			return err
		}
		defer images.Close()
		for _, r := range d.refs {
			labels, err := images.Labels(ctx, r)
			if err != nil {
				return err
			}
			fmt.Printf("    %s: %s=%s\n", r, containerd.PinnedLabel, labels[containerd.PinnedLabel])
		}
		record, _ := os.ReadFile(filepath.Join(dir, "state", "containerd-labels.json"))
		step("imagepind's record of the labels it set (state_dir/containerd-labels.json)")
		fmt.Print(indent(string(record)))
	}

	if err := d.prove(ctx); err != nil {
		return err
	}
	step("cleaning up what the demo started (pod by ID; imagepind, %s and the registry by PID)", d.runtimeName())
	return nil
}

// add records a pinned image under its short name.
func (d *demo) add(name, ref string) string {
	d.refs = append(d.refs, ref)
	d.names[ref] = name
	return ref
}

func (d *demo) runtimeName() string {
	if d.crio != nil {
		return "CRI-O"
	}
	return "containerd"
}

// waitReady polls the status file until the set is Ready with every image, printing
// each change of its line; seen (when not nil) gets each line.
func (d *demo) waitReady(timeout time.Duration, seen func(string)) error {
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		n, _ := status.ReadFile(d.statusFile)
		if s := n.Set("upgrade-workers"); s != nil {
			line := setLine(s)
			if line != last {
				fmt.Println(line)
				last = line
				if seen != nil {
					seen(line)
				}
			}
			if s.Phase == status.Ready && s.ImagesReady == s.ImagesTotal {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not Ready after %s; see %s", timeout, d.daemonLog)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func setLine(s *status.Set) string {
	line := fmt.Sprintf("    %s %d/%d images", s.Phase, s.ImagesReady, s.ImagesTotal)
	if c := s.Condition(status.ConditionReady); c != nil {
		line += " — " + c.Reason + ": " + c.Message
	}
	return line
}

func (d *demo) imagepinctlStatus() {
	step("imagepinctl status")
	out, _ := exec.Command(filepath.Join(d.bin, "imagepinctl"), "status", "--config", d.cfgPath).CombinedOutput()
	fmt.Print(indent(string(out)))
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("    " + l + "\n")
	}
	return b.String()
}

// runtimeVersion is the version the cache's runtime binary says it is, or why not.
func runtimeVersion(binary string) string {
	v, err := env.RuntimeVersion(binary)
	if err != nil {
		return "(version unknown: " + err.Error() + ")"
	}
	return v
}
