package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/imagepin/imagepin/status"
)

// crictl runs the cached crictl against the demo's runtime.
type crictl struct{ bin, endpoint string }

// run returns crictl's stdout; its error carries stderr.
func (c crictl) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.bin, append([]string{"--runtime-endpoint", c.endpoint, "--image-endpoint", c.endpoint, "--timeout", "60s"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("crictl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// prove is the ending: what the node keeps once its registry is gone, each claim
// checked before it is printed.
func (d *demo) prove(ctx context.Context) error {
	var proved []string

	// 1. Something unpinned on the node, as any workload leaves behind.
	step("a workload pulls an image that is NOT pinned (acme/debug-tools), with the registry up")
	if _, err := d.crictl.run(ctx, "pull", d.loose); err != nil {
		return err
	}
	if err := d.expectPresent(ctx, d.loose, true); err != nil {
		return err
	}
	fmt.Println("    pulled")

	// 2. The kubelet's image GC: crictl rmi --prune skips what the runtime reports pinned
	// (cri-tools' own rule, the kubelet's too); checked below, not assumed.
	step("image garbage collection, kubelet-style: crictl rmi --prune (removes every image no container uses, skipping those the runtime reports pinned)")
	out, err := d.crictl.run(ctx, "rmi", "--prune")
	if err != nil {
		return err
	}
	fmt.Print(indent(strings.TrimSpace(out)))
	if err := d.expectPresent(ctx, d.loose, false); err != nil {
		return fmt.Errorf("after rmi --prune: %w", err)
	}
	for _, r := range d.refs {
		if err := d.expectPinned(ctx, r); err != nil {
			return fmt.Errorf("after rmi --prune: %w", err)
		}
	}
	fmt.Printf("    checked: %s is gone; all %d pinned images are still present and pinned\n", d.names[d.loose], len(d.refs))
	proved = append(proved, fmt.Sprintf("Image garbage collection (crictl rmi --prune, which skips pinned images as the kubelet's does) deleted the unpinned image and left all %d pinned images.", len(d.refs)))

	// 3. The registry goes away: stopped by the PID this demo started it with.
	pid := d.reg.PID()
	step("stopping the registry (pid %d, started by this demo)", pid)
	d.reg.Stop()
	if err := processGone(pid); err != nil {
		return err
	}
	if err := registryDown(d.reg.Host); err != nil {
		return err
	}
	fmt.Printf("    checked: pid %d has exited; http://%s/v2/ refuses connections\n", pid, d.reg.Host)

	step("pulling the unpinned image again: it cannot come back")
	if _, err := d.crictl.run(ctx, "pull", d.loose); err == nil {
		return fmt.Errorf("pulling %s succeeded with the registry gone", d.loose)
	} else {
		fmt.Printf("    %s says: %s\n", d.runtimeName(), brief(err.Error()))
	}
	if err := d.expectPresent(ctx, d.loose, false); err != nil {
		return err
	}
	proved = append([]string{fmt.Sprintf("The registry is gone: its process (pid %d) was stopped, http://%s/v2/ refuses connections, and a pull of the unpinned image now fails.", pid, d.reg.Host)}, proved...)

	// 4. A pinned image deleted behind imagepind's back comes back (CRI-O: from the
	// node-local mirror's store).
	if d.crio != nil {
		line, err := d.deleteAndComeBack(ctx)
		if err != nil {
			return err
		}
		proved = append(proved, line)
	} else {
		step("not shown on containerd: a pinned image deleted behind imagepind's back coming back with the registry gone")
		fmt.Println("    containerd's content store is the node's only copy of a layer, and crictl rmi lets containerd's")
		fmt.Println("    garbage collector delete it: such an image comes back from a peer node ([peers] with other nodes,")
		fmt.Println("    e2e TestPeersOnContainerd) or the registry, not from this node. On CRI-O, imagepind's node-local")
		fmt.Println("    mirror keeps a copy of the compressed layers, and make demo shows it coming back.")
	}

	step("what %s holds now: crictl images --pinned", d.runtimeName())
	out, err = d.crictl.run(ctx, "images", "--pinned", "--digests")
	if err != nil {
		return err
	}
	fmt.Print(indent(strings.TrimSpace(out)))
	for _, r := range d.refs {
		if err := d.expectPinned(ctx, r); err != nil {
			return err
		}
	}

	// 5. A pod starts from it.
	podLine, err := d.runPod(ctx)
	if err != nil {
		return err
	}
	proved = append(proved, podLine)

	// 6. imagepind's view again.
	n, _ := status.ReadFile(d.statusFile)
	s := n.Set("upgrade-workers")
	if s == nil || s.Phase != status.Ready || s.ImagesReady != s.ImagesTotal {
		return fmt.Errorf("imagepind's status at the end is not Ready: %+v", s)
	}
	d.imagepinctlStatus()
	if err := registryDown(d.reg.Host); err != nil {
		return err
	}
	proved = append(proved, fmt.Sprintf("imagepind's status says Ready %d/%d, and every pinned image is present and pinned in %s (checked over CRI) — with the registry still down.", s.ImagesReady, s.ImagesTotal, d.runtimeName()))

	step("what this proved (each line checked by a step above)")
	for i, p := range proved {
		fmt.Printf("    %d. %s\n", i+1, p)
	}
	if d.ctr != nil {
		fmt.Println("    (Not shown on containerd: an image deleted behind imagepind's back coming back without the registry; see above.)")
	}
	return nil
}

// deleteAndComeBack removes the runnable pinned image with crictl rmi and waits for
// imagepind to pull it again, through its node-local mirror, with the registry gone.
func (d *demo) deleteAndComeBack(ctx context.Context) (string, error) {
	name := d.names[d.payments]
	fromStore0, err := d.servedFromStore()
	if err != nil {
		return "", err
	}
	step("deleting a pinned image behind imagepind's back: crictl rmi %s", name)
	if _, err := d.crictl.run(ctx, "rmi", d.payments); err != nil {
		return "", err
	}
	deleted := time.Now()
	if err := d.expectPresent(ctx, d.payments, false); err != nil {
		return "", err
	}
	fmt.Printf("    checked: %s is gone from CRI-O's storage\n", name)
	n, _ := status.ReadFile(d.statusFile)
	if s := n.Set("upgrade-workers"); s != nil {
		fmt.Printf("    imagepind has not looked yet (CRI-O sends no event; imagepind lists the runtime's images every 2 minutes):\n%s\n", setLine(s))
	}
	// Rather than wait up to 2 minutes for the presence check: what an administrator
	// who removed images by hand runs, systemctl reload imagepind (SIGHUP).
	step("reloading imagepind as `systemctl reload imagepind` does (SIGHUP to pid %d): it looks at the node now instead of at its next presence check", d.daemon.Pid)
	if err := d.daemon.Signal(syscall.SIGHUP); err != nil {
		return "", fmt.Errorf("reload imagepind: %w", err)
	}

	step("waiting for imagepind to notice and pull it again — the registry is gone, so only the node-local mirror can serve it")
	deadline := deleted.Add(3 * time.Minute)
	nextNote := time.Now().Add(30 * time.Second)
	var back time.Duration
	for {
		img, err := d.client.ImageStatus(ctx, d.payments)
		if err == nil && img.Present && img.Pinned {
			back = time.Since(deleted)
			break
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("%s did not come back within 3 minutes of its deletion; see %s", name, d.daemonLog)
		}
		if time.Now().After(nextNote) {
			fmt.Printf("    … %s since the deletion\n", time.Since(deleted).Round(time.Second))
			nextNote = nextNote.Add(30 * time.Second)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	fmt.Printf("    %s is back in CRI-O's storage, pinned, %s after its deletion\n", name, back.Round(100*time.Millisecond))
	log, _ := os.ReadFile(d.daemonLog)
	noticed := false
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, "no longer listed by the runtime") {
			noticed = true
		}
		// From imagepind's notice on: what it said about the image (level and message).
		if noticed && strings.Contains(l, d.payments) {
			fmt.Println("    imagepind log: " + logGist(l))
		}
	}
	if !noticed {
		return "", fmt.Errorf("%s came back, but imagepind's log does not say it noticed the deletion; see %s", name, d.daemonLog)
	}
	fromStore1, err := d.servedFromStore()
	if err != nil {
		return "", err
	}
	served := fromStore1 - fromStore0
	fmt.Printf("    imagepin_mirror_served_bytes_total{from=\"store\"}: %.0f → %.0f (+%s served to CRI-O from the node-local mirror's store)\n", fromStore0, fromStore1, kib(served))
	if served < 256<<10 {
		return "", fmt.Errorf("the node-local mirror served %.0f bytes from its store; %s alone has a 256 KiB layer of its own", served, name)
	}
	step("imagepind's status again")
	if err := d.waitReady(30*time.Second, nil); err != nil {
		return "", err
	}
	return fmt.Sprintf("A pinned image (%s) deleted behind imagepind's back (crictl rmi) came back with the registry gone, %s after its deletion: imagepind noticed when reloaded (otherwise at its presence check, every 2 minutes on CRI-O, which sends no events) and pulled it again, and CRI-O read %s of it from the node-local mirror's store.",
		name, back.Round(100*time.Millisecond), kib(served)), nil
}

// runPod starts a pod (crictl runp/create/start, host network, no pull) from the
// runnable pinned image and waits for its process's line in the container log.
func (d *demo) runPod(ctx context.Context) (string, error) {
	name := d.names[d.payments]
	step("starting a pod from %s with the registry gone (crictl runp + create --no-pull + start; host network)", name)
	podDir := filepath.Join(d.dir, "pod")
	logDir := filepath.Join(podDir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return "", err
	}
	// The kubelet's namespaces for a hostNetwork pod without shareProcessNamespace:
	// network NODE (2), pid CONTAINER (1).
	ns := map[string]any{"network": 2, "pid": 1}
	pod := map[string]any{
		"metadata":      map[string]any{"name": "payments", "namespace": "demo", "uid": "imagepin-demo-payments", "attempt": 0},
		"log_directory": logDir,
		"linux":         map[string]any{"security_context": map[string]any{"namespace_options": ns}},
	}
	ctr := map[string]any{
		"metadata": map[string]any{"name": "payments"},
		"image":    map[string]any{"image": d.payments},
		"log_path": "payments.log",
		// podapp logs $HOSTNAME; a host-network pod gets no hostname of its own.
		"envs":  []map[string]string{{"key": "HOSTNAME", "value": "payments"}},
		"linux": map[string]any{"security_context": map[string]any{"namespace_options": ns}},
	}
	podFile, ctrFile := filepath.Join(podDir, "pod.json"), filepath.Join(podDir, "container.json")
	for f, v := range map[string]any{podFile: pod, ctrFile: ctr} {
		b, _ := json.MarshalIndent(v, "", "  ")
		if err := os.WriteFile(f, b, 0o644); err != nil {
			return "", err
		}
	}
	// Removed before the runtime stops (deferred calls run last-in, first-out): its
	// processes are the demo's to end, by the pod's ID (or, when runp failed half-way,
	// by the IDs of the pods of that name on the demo's own runtime).
	var podID string
	d.cleanupPod = func() {
		cctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		ids := []string{podID}
		if podID == "" {
			out, _ := d.crictl.run(cctx, "pods", "--name", "payments", "-q")
			ids = strings.Fields(out)
		}
		for _, id := range ids {
			d.crictl.run(cctx, "stopp", id)
			d.crictl.run(cctx, "rmp", "-f", id)
		}
	}
	out, err := d.crictl.run(ctx, "runp", podFile)
	if err != nil {
		return "", err
	}
	podID = lastLine(out)
	out, err = d.crictl.run(ctx, "create", "--no-pull", podID, ctrFile, podFile)
	if err != nil {
		return "", err
	}
	ctrID := lastLine(out)
	if _, err := d.crictl.run(ctx, "start", ctrID); err != nil {
		return "", err
	}
	started := time.Now()
	logFile := filepath.Join(logDir, "payments.log")
	for {
		b, _ := os.ReadFile(logFile)
		if i := strings.Index(string(b), "imagepin pod started"); i >= 0 {
			line := strings.TrimSpace(strings.SplitN(string(b[i:]), "\n", 2)[0])
			fmt.Printf("    pod %.13s, container %.13s running; its log: %q\n", podID, ctrID, line)
			return fmt.Sprintf("A pod started from %s with the registry gone (its process logged %q).", name, line), nil
		}
		if time.Since(started) > 30*time.Second {
			st, _ := d.crictl.run(ctx, "ps", "-a")
			return "", fmt.Errorf("the pod's container did not log its start within 30 s; crictl ps -a:\n%s", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (d *demo) expectPresent(ctx context.Context, ref string, want bool) error {
	img, err := d.client.ImageStatus(ctx, ref)
	if err != nil {
		return err
	}
	if img.Present != want {
		return fmt.Errorf("%s: present=%v, expected %v", d.names[ref], img.Present, want)
	}
	return nil
}

func (d *demo) expectPinned(ctx context.Context, ref string) error {
	img, err := d.client.ImageStatus(ctx, ref)
	if err != nil {
		return err
	}
	if !img.Present || !img.Pinned {
		return fmt.Errorf("%s: present=%v pinned=%v, expected both", d.names[ref], img.Present, img.Pinned)
	}
	return nil
}

// servedFromStore reads imagepin_mirror_served_bytes_total{from="store"} (0 before the
// first serve).
func (d *demo) servedFromStore() (float64, error) {
	resp, err := http.Get("http://" + d.metrics + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, `imagepin_mirror_served_bytes_total{from="store"} `); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, nil
}

// processGone checks that pid no longer exists (the registry was waited for, so it is
// not a zombie either).
func processGone(pid int) error {
	if pid == 0 {
		return errors.New("the registry had no PID")
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		return fmt.Errorf("pid %d still exists after the registry was stopped", pid)
	}
	return nil
}

func registryDown(host string) error {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + host + "/v2/")
	if err == nil {
		resp.Body.Close()
		return fmt.Errorf("http://%s/v2/ still answers (%s)", host, resp.Status)
	}
	if !strings.Contains(err.Error(), "connection refused") {
		return fmt.Errorf("http://%s/v2/: %v (expected connection refused)", host, err)
	}
	return nil
}

// brief is the gist of a runtime's error: from its last "desc = " on, one line, with
// crictl's log quoting undone, cut.
func brief(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if i := strings.LastIndex(s, "desc = "); i >= 0 {
		s = s[i+len("desc = "):]
	}
	s = strings.TrimRight(strings.ReplaceAll(s, `\"`, `"`), `"`)
	if len(s) <= 240 {
		return s
	}
	// Its first phrase (up to the first ": ", or 60 bytes to a word) and its last 160
	// bytes from a word on.
	head := s
	if i := strings.Index(s, ": "); i > 0 && i < 60 {
		head = s[:i]
	} else if i := strings.LastIndex(s[:60], " "); i > 0 {
		head = s[:i]
	} else {
		head = s[:60]
	}
	tail := s[len(s)-160:]
	if i := strings.Index(tail, " "); i >= 0 {
		tail = tail[i+1:]
	}
	return head + ": … " + tail
}

// logGist is an imagepind log line without its time and image fields (the image is
// named on the step's line): level=… msg=… and the rest.
func logGist(l string) string {
	if i := strings.Index(l, "level="); i >= 0 {
		l = l[i:]
	}
	if i := strings.Index(l, " image=\""); i >= 0 {
		if j := strings.Index(l[i+len(" image=\""):], "\""); j >= 0 {
			l = l[:i] + l[i+len(" image=\"")+j+1:]
		}
	}
	return l
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func kib(b float64) string { return fmt.Sprintf("%.0f KiB", b/1024) }
