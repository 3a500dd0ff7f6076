// Command demo is `make demo`: a local registry with a few sample images, a real CRI-O,
// and imagepind pinning and pre-loading a sample set, with its progress and final status
// printed. Everything runs under a temporary directory and is removed at the end.
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

	step("starting CRI-O %s (from %s)", "1.34.0", env.CacheDir())
	c, err := env.NewCRIO(filepath.Join(dir, "crio"), env.CRIOOptions{Insecure: []string{reg.Host}})
	if err != nil {
		return err
	}
	if err := c.Start(ctx); err != nil {
		return err
	}
	defer c.Cleanup()

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
[cri]
endpoint = "unix://%s"
[crio]
config = %q
config_dir = %q
reload = "signal"
`, setsDir, filepath.Join(dir, "state"), statusFile, filepath.Join(dir, "labels.json"), c.Socket, c.Config, c.ConfigDir) + c.DiskConfig()
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

	step("what CRI-O has: its live pinned_images and each image's CRI status")
	pins, err := crio.NewLiveConfig(c.Socket).PinnedImages(ctx)
	if err != nil {
		return err
	}
	for _, p := range pins {
		fmt.Printf("    pinned_images: %s\n", p)
	}
	client, err := cri.Dial("unix://" + c.Socket)
	if err != nil {
		return err
	}
	defer client.Close()
	for _, r := range refs {
		img, err := client.ImageStatus(ctx, r)
		if err != nil {
			return err
		}
		fmt.Printf("    %-100s present=%v pinned=%v\n", r, img.Present, img.Pinned)
	}
	dropIn, _ := os.ReadFile(filepath.Join(c.ConfigDir, crio.ManagedFileName))
	step("the managed drop-in %s", crio.ManagedFileName)
	fmt.Print(indent(string(dropIn)))
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
