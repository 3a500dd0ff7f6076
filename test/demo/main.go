// Command demo is `make demo`: a local registry with a few sample images, a real CRI-O
// (or, with RUNTIME=containerd, a real containerd), and imagepind pinning and
// pre-loading a sample set, with its progress and final status printed. Everything runs
// under a temporary directory and is removed at the end.
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
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

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

	step("starting a local registry")
	os.MkdirAll(filepath.Join(dir, "registry"), 0o755)
	reg, err := env.StartRegistry(filepath.Join(dir, "registry"))
	if err != nil {
		return err
	}
	defer reg.Stop()

	step("pushing sample images to %s (shared base layer, distinct app layers)", reg.Host)
	base, err := env.RandomLayer(512 << 10)
	if err != nil {
		return err
	}
	var refs []string
	for _, name := range []string{"openshift/etcd", "openshift/kube-apiserver", "openshift/ovn-kubernetes", "acme/payments"} {
		img, err := reg.PushRandom(ctx, name, 2, 256<<10, base)
		if err != nil {
			return err
		}
		refs = append(refs, img.Ref())
		fmt.Printf("    %s (%d KiB compressed)\n", img.Ref(), img.Size>>10)
	}

	setsDir := filepath.Join(dir, "sets.d")
	os.MkdirAll(setsDir, 0o755)
	statusFile := filepath.Join(dir, "status.json")
	cfg := fmt.Sprintf(`sets_dir = %q
state_dir = %q
status_file = %q
[node]
name = "demo-worker-0"
labels = {"node-role.kubernetes.io/worker" = ""}
labels_file = %q
`, setsDir, filepath.Join(dir, "state"), statusFile, filepath.Join(dir, "labels.json"))
	var socket string
	var c *env.CRIO
	var ctr *env.Containerd
	switch runtime := os.Getenv("RUNTIME"); runtime {
	case "", "cri-o", "crio":
		step("starting CRI-O %s (from %s)", "1.34.0", env.CacheDir())
		if c, err = env.NewCRIO(filepath.Join(dir, "crio"), env.CRIOOptions{Insecure: []string{reg.Host}}); err != nil {
			return err
		}
		if err := c.Start(ctx); err != nil {
			return err
		}
		defer c.Cleanup()
		socket = c.Socket
		cfg += fmt.Sprintf("[cri]\nendpoint = \"unix://%s\"\n[crio]\nconfig = %q\nconfig_dir = %q\nreload = \"signal\"\n", c.Socket, c.Config, c.ConfigDir) + c.DiskConfig()
	case "containerd":
		step("starting containerd %s (from %s)", "2.2.9", env.CacheDir())
		if ctr, err = env.NewContainerd(filepath.Join(dir, "containerd"), env.ContainerdOptions{Insecure: []string{reg.Host}}); err != nil {
			return err
		}
		if err := ctr.Start(ctx); err != nil {
			return err
		}
		defer ctr.Cleanup()
		socket = ctr.Socket
		// [cri] runtime stays "auto": imagepind asks CRI Version and finds containerd.
		cfg += fmt.Sprintf("[cri]\nendpoint = \"unix://%s\"\n[containerd]\nconfig_path = %q\n", ctr.Socket, ctr.HostsDir)
	default:
		return fmt.Errorf("RUNTIME=%q: cri-o or containerd", runtime)
	}
	cfgPath := filepath.Join(dir, "imagepind.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}

	step("starting imagepind (log: %s)", filepath.Join(dir, "imagepind.log"))
	logf, _ := os.Create(filepath.Join(dir, "imagepind.log"))
	daemon := exec.CommandContext(ctx, filepath.Join(bin, "imagepind"), "--config", cfgPath)
	daemon.Stdout, daemon.Stderr = logf, logf
	if err := daemon.Start(); err != nil {
		return err
	}
	defer func() { daemon.Process.Signal(os.Interrupt); daemon.Wait() }()

	var set strings.Builder
	set.WriteString(`apiVersion: machineconfiguration.openshift.io/v1
kind: PinnedImageSet
metadata:
  name: upgrade-workers
  labels: {machineconfiguration.openshift.io/role: worker}
spec:
  pinnedImages:
`)
	for _, r := range refs {
		fmt.Fprintf(&set, "  - name: %s\n", r)
	}
	step("dropping sets.d/upgrade-workers.yaml (%d images)", len(refs))
	fmt.Print(indent(set.String()))
	tmp := filepath.Join(setsDir, ".upgrade-workers.yaml.tmp")
	os.WriteFile(tmp, []byte(set.String()), 0o644)
	os.Rename(tmp, filepath.Join(setsDir, "upgrade-workers.yaml"))

	step("waiting for the set to be Ready")
	deadline := time.Now().Add(2 * time.Minute)
	last := ""
	for {
		n, _ := status.ReadFile(statusFile)
		if s := n.Set("upgrade-workers"); s != nil {
			line := fmt.Sprintf("    %s %d/%d images", s.Phase, s.ImagesReady, s.ImagesTotal)
			if c := s.Condition(status.ConditionReady); c != nil {
				line += " — " + c.Reason + ": " + c.Message
			}
			if line != last {
				fmt.Println(line)
				last = line
			}
			if s.Phase == status.Ready {
				break
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not Ready after 2 minutes; see %s", filepath.Join(dir, "imagepind.log"))
		}
		time.Sleep(100 * time.Millisecond)
	}

	step("imagepinctl status")
	out, _ := exec.Command(filepath.Join(bin, "imagepinctl"), "status", "--config", cfgPath).CombinedOutput()
	fmt.Print(indent(string(out)))

	client, err := cri.Dial("unix://" + socket)
	if err != nil {
		return err
	}
	defer client.Close()
	if c != nil {
		step("what CRI-O has: its live pinned_images and each image's CRI status")
		pins, err := crio.NewLiveConfig(c.Socket).PinnedImages(ctx)
		if err != nil {
			return err
		}
		for _, p := range pins {
			fmt.Printf("    pinned_images: %s\n", p)
		}
	} else {
		step("what containerd has: each image's CRI status and the records carrying the pinned label")
	}
	for _, r := range refs {
		img, err := client.ImageStatus(ctx, r)
		if err != nil {
			return err
		}
		fmt.Printf("    %-100s present=%v pinned=%v\n", r, img.Present, img.Pinned)
	}
	if c != nil {
		dropIn, _ := os.ReadFile(filepath.Join(c.ConfigDir, crio.ManagedFileName))
		step("the managed drop-in %s", crio.ManagedFileName)
		fmt.Print(indent(string(dropIn)))
	} else {
		images, err := containerd.DialImages(ctr.Socket, "k8s.io")
		if err != nil {
			return err
		}
		defer images.Close()
		for _, r := range refs {
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
	step("done; cleaning up")
	return nil
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("    " + l + "\n")
	}
	return b.String()
}
