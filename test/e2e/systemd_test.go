//go:build e2e

package e2e

import (
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
)

// newSystemdWorld is a world whose CRI-O runs as crio.service and whose imagepind runs as
// the shipped imagepind.service (plus a test drop-in), under a real systemd (PID 1 of a
// namespace) and a real system bus. watchdogSec overrides the unit's WatchdogSec.
func newSystemdWorld(t *testing.T, o worldOptions, watchdogSec string) (*world, *env.Systemd) {
	t.Helper()
	if o.reload == "" {
		o.reload = "systemd"
	}
	o.metrics = true
	w := baseWorld(t)
	c, dir := w.crio, w.dir
	shipped, err := os.ReadFile("../../packaging/systemd/imagepind.service")
	if err != nil {
		t.Fatal(err)
	}
	crioUnit := fmt.Sprintf(`[Unit]
Description=CRI-O (test)
DefaultDependencies=no
[Service]
Type=notify
Environment=%s
ExecStart=%s
ExecReload=/bin/kill -s HUP $MAINPID
StandardOutput=append:%s
StandardError=append:%s
TimeoutStartSec=60
`, strings.Join(c.Environment(), " "), strings.Join(c.Command(), " "), c.LogFile, c.LogFile)
	dropIn := fmt.Sprintf(`# Only what the test environment needs differs from the shipped unit.
[Unit]
DefaultDependencies=no
[Service]
ExecStart=
ExecStart=%s --config %s --log-level debug
StandardOutput=append:%s
StandardError=append:%s
# The test's files live under /tmp: share it and let imagepind write there.
PrivateTmp=no
ReadWritePaths=%s
# Keep the host's /var/lib clean: the test's state_dir is under its directory.
StateDirectory=
RestartSec=500ms
`, filepath.Join(binDir, "imagepind"), w.config, filepath.Join(dir, "imagepind.log"), filepath.Join(dir, "imagepind.log"), dir)
	if watchdogSec != "" {
		dropIn += "WatchdogSec=" + watchdogSec + "\n"
	}
	sd, err := env.StartSystemd(filepath.Join(dir, "systemd"), map[string]string{
		"crio.service":                  crioUnit,
		"imagepind.service":             string(shipped),
		"imagepind.service.d/test.conf": dropIn,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "imagepind.log"))
			t.Logf("imagepind log:\n%s", tail(string(b), 80))
			out, _ := sd.Systemctl("status", "--no-pager", "imagepind.service", "crio.service")
			t.Logf("systemctl status:\n%s", out)
			t.Logf("CRI-O log:\n%s", c.LogTail(80))
		}
		sd.Stop()
		c.Cleanup()
	})
	w.writeConfig(o)
	return w, sd
}

// startUnits starts crio.service, then imagepind.service (which only orders itself after it), and waits for both.
func startUnits(t *testing.T, w *world, sd *env.Systemd) {
	t.Helper()
	if err := sd.Start("crio.service"); err != nil {
		t.Fatalf("%v\n%s", err, w.crio.LogTail(30))
	}
	w.dialCRI()
	// Type=notify: start returns once imagepind sent READY=1 after its first reconcile.
	if err := sd.Start("imagepind.service"); err != nil {
		b, _ := os.ReadFile(filepath.Join(w.dir, "imagepind.log"))
		t.Fatalf("%v\n%s", err, b)
	}
	if st := sd.Property("imagepind.service", "ActiveState"); st != "active" {
		t.Fatalf("imagepind.service is %s", st)
	}
}

func (w *world) log() string {
	b, _ := os.ReadFile(filepath.Join(w.dir, "imagepind.log"))
	return string(b)
}

// The shipped unit under real systemd: READY after the first reconcile, STATUS kept
// current, the watchdog fed while idle, the reload over real D-Bus and then confirmed.
func TestSystemdUnitNotifyWatchdogAndDBusReload(t *testing.T) {
	w, sd := newSystemdWorld(t, worldOptions{reload: "systemd"}, "3s")
	refs := w.push("sd", 3)
	startUnits(t, w, sd)
	w.writeSet("sd.yaml", alphaSet("sd", refs...))
	w.waitFor("Ready", 60*time.Second, phaseIs("sd", status.Ready))
	w.requirePinned(refs...)
	waitUntil(t, "STATUS=", 10*time.Second, func() bool {
		return sd.Property("imagepind.service", "StatusText") == "1 set Ready"
	})
	if strings.Contains(w.log(), "sending SIGHUP") {
		t.Fatal("reload = systemd must not fall back to the signal")
	}
	if !strings.Contains(w.crio.LogTail(400), "Set config pinned_images") {
		t.Fatal("CRI-O did not reload its pins")
	}
	// systemctl reload imagepind (the unit's ExecReload, SIGHUP): a pinned image removed by
	// hand comes back now, not at the next presence check (2 minutes on CRI-O), and the
	// same process goes on.
	pid0 := sd.Property("imagepind.service", "MainPID")
	if out, err := exec.Command(filepath.Join(env.CacheDir(), "crictl"), "--runtime-endpoint", "unix://"+w.socket(), "rmi", refs[0]).CombinedOutput(); err != nil {
		t.Fatalf("crictl rmi: %v %s", err, out)
	}
	removed := time.Now()
	if out, err := sd.Systemctl("reload", "imagepind.service"); err != nil {
		t.Fatalf("systemctl reload imagepind: %v %s", err, out)
	}
	waitUntil(t, "the removed image back after the reload", 30*time.Second, func() bool {
		img, err := w.cri.ImageStatus(t.Context(), refs[0])
		return err == nil && img.Present && img.Pinned
	})
	t.Logf("systemctl reload imagepind: the removed image back and pinned %s after its removal", time.Since(removed).Round(10*time.Millisecond))
	if !strings.Contains(w.log(), "looking at the node again now (reload)") {
		t.Fatal("imagepind's log does not show the reload")
	}
	if pid := sd.Property("imagepind.service", "MainPID"); pid != pid0 || sd.Property("imagepind.service", "NRestarts") != "0" {
		t.Fatalf("the reload restarted imagepind: MainPID %s → %s, NRestarts %s", pid0, pid, sd.Property("imagepind.service", "NRestarts"))
	}
	w.waitFor("Ready after the reload", 30*time.Second, phaseIs("sd", status.Ready))
	// Idle for longer than WatchdogSec (3s): pinged by the loop, not killed.
	first := sd.Property("imagepind.service", "WatchdogTimestampMonotonic")
	time.Sleep(7 * time.Second)
	if n := sd.Property("imagepind.service", "NRestarts"); n != "0" {
		t.Fatalf("imagepind restarted %s times while idle: the watchdog was not fed", n)
	}
	if later := sd.Property("imagepind.service", "WatchdogTimestampMonotonic"); later == first || later == "0" {
		t.Fatalf("no watchdog pings: %s → %s", first, later)
	}
	// A CRI-O outage longer than WatchdogSec does not get imagepind killed either.
	if _, err := sd.Systemctl("stop", "crio.service"); err != nil {
		t.Fatal(err)
	}
	more := w.push("sd-more", 1)
	w.writeSet("more.yaml", alphaSet("more", more...))
	w.waitFor("RuntimeUnavailable", 30*time.Second, func(n status.Node) bool {
		s := n.Set("more")
		return s != nil && s.Condition(status.ConditionProgressing).Reason == status.ReasonRuntimeUnavailable
	})
	time.Sleep(5 * time.Second)
	if n := sd.Property("imagepind.service", "NRestarts"); n != "0" {
		t.Fatalf("imagepind restarted %s times during a CRI-O outage", n)
	}
	if err := sd.Start("crio.service"); err != nil {
		t.Fatal(err)
	}
	w.waitFor("both Ready after CRI-O returns", 60*time.Second, func(n status.Node) bool {
		return phaseIs("sd", status.Ready)(n) && phaseIs("more", status.Ready)(n)
	})
	w.requirePinned(append(refs, more...)...)
	// Metrics are served (5 pulls: the 4 images, and the one removed and pulled again).
	metrics := scrape(t, w)
	for _, want := range []string{`imagepin_set_images_ready{set="sd"} 3`, `imagepin_set_phase{phase="Ready",set="more"} 1`, `imagepin_pulls_total{result="success"} 5`, `imagepin_reloads_total{result="confirmed"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// kill -9 in the middle of pulling: systemd restarts imagepind, which converges.
func TestSystemdKill9MidPull(t *testing.T) {
	w, sd := newSystemdWorld(t, worldOptions{pullConcurrency: 1}, "")
	var refs []string
	for i := 0; i < 24; i++ {
		img, err := w.reg.PushRandom(context.Background(), fmt.Sprintf("big-%d", i), 2, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, img.Ref())
	}
	startUnits(t, w, sd)
	w.writeSet("big.yaml", alphaSet("big", refs...))
	waitUntil(t, "a first pull", 60*time.Second, func() bool { return strings.Contains(w.log(), "msg=pulled") })
	pid, _ := strconv.Atoi(sd.Property("imagepind.service", "MainPID"))
	n := w.readStatus()
	if s := n.Set("big"); s == nil || s.Phase != status.Pulling {
		t.Fatalf("not mid-pull: %+v", s)
	}
	if err := syscall.Kill(hostPID(t, sd, pid), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a restart", 30*time.Second, func() bool { return sd.Property("imagepind.service", "NRestarts") == "1" })
	w.waitFor("Ready after the restart", 120*time.Second, phaseIs("big", status.Ready))
	w.requirePinned(refs...)
	w.requireConfigParses()
	if got := strings.Count(w.log(), "imagepind starting"); got != 2 {
		t.Fatalf("imagepind started %d times, want 2", got)
	}
}

// The system bus gone: reload = "auto" falls back to SIGHUP and still confirms.
func TestSystemdBusGoneAutoFallsBackToSignal(t *testing.T) {
	w, sd := newSystemdWorld(t, worldOptions{reload: "auto"}, "")
	refs := w.push("bus", 2)
	startUnits(t, w, sd)
	if out, err := sd.Systemctl("stop", "dbus.socket", "dbus.service"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	w.writeSet("bus.yaml", alphaSet("bus", refs...))
	w.waitFor("Ready", 60*time.Second, phaseIs("bus", status.Ready))
	w.requirePinned(refs...)
	if !strings.Contains(w.log(), "systemd unavailable for the reload; sending SIGHUP") {
		t.Fatal("no fallback to the signal in the log")
	}
}

// The registry down: PullRetrying, then Ready when it returns. The sets directory
// removed: a fault, nothing unpinned.
func TestSystemdRegistryDownAndSetsDirRemoved(t *testing.T) {
	w, sd := newSystemdWorld(t, worldOptions{unpinDelay: "1s"}, "")
	refs := w.push("reg", 2)
	startUnits(t, w, sd)
	w.reg.Stop()
	w.writeSet("reg.yaml", alphaSet("reg", refs...))
	n := w.waitFor("PullRetrying", 60*time.Second, func(n status.Node) bool {
		s := n.Set("reg")
		return s != nil && s.Phase == status.Pulling && s.Condition(status.ConditionProgressing).Reason == status.ReasonPullRetrying
	})
	if msg := n.Set("reg").Condition(status.ConditionProgressing).Message; !strings.Contains(msg, "connection refused") {
		t.Fatalf("the retry message should carry CRI-O's error: %q", msg)
	}
	if err := w.reg.Restart(); err != nil {
		t.Fatal(err)
	}
	w.waitFor("Ready after the registry returns", 90*time.Second, phaseIs("reg", status.Ready))
	w.requirePinned(refs...)

	if err := os.Rename(w.setsDir, w.setsDir+".gone"); err != nil {
		t.Fatal(err)
	}
	n = w.waitFor("a fault", 20*time.Second, func(n status.Node) bool { return len(n.Faults) > 0 })
	if !strings.Contains(strings.Join(n.Faults, "\n"), "sets directory is missing") {
		t.Fatalf("faults: %q", n.Faults)
	}
	time.Sleep(3 * time.Second) // past unpin_delay
	w.requirePinned(refs...)
	after := w.readStatus()
	if s := after.Set("reg"); s == nil || s.Phase != status.Ready {
		t.Fatalf("the set must stay: %+v", s)
	}
}

// A registry that accepts connections and never answers, under the shipped unit with a
// 3 s watchdog: imagepind is not restarted (the disk check runs off the loop, each image
// bounded), another set still becomes Ready, and the stalled set says why it waits.
func TestSystemdStalledRegistryNoRestart(t *testing.T) {
	// TLS completes (its CA is in certs.d), then no request is ever answered.
	release := make(chan struct{})
	var asked atomic.Int64
	stall := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	stall.StartTLS()
	t.Cleanup(func() { close(release); stall.Close() })
	w, sd := newSystemdWorld(t, worldOptions{}, "3s")
	refs := w.push("ok", 1)
	host := strings.TrimPrefix(stall.URL, "https://")
	os.MkdirAll(filepath.Join(w.crio.CertsDir(), host), 0o755)
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: stall.Certificate().Raw})
	if err := os.WriteFile(filepath.Join(w.crio.CertsDir(), host, "ca.crt"), pemBytes, 0o644); err != nil {
		t.Fatal(err)
	}
	startUnits(t, w, sd)
	pid := sd.Property("imagepind.service", "MainPID")
	stalled := host + "/x/stalled@sha256:" + strings.Repeat("5", 64)
	w.writeSet("stall.yaml", alphaSet("stall", stalled))
	w.writeSet("ok.yaml", alphaSet("ok", refs...))
	w.waitFor("ok Ready while a registry stalls", 120*time.Second, phaseIs("ok", status.Ready))
	n := w.waitFor("the stalled set says why", 120*time.Second, func(n status.Node) bool {
		s := n.Set("stall")
		return s != nil && strings.Contains(s.Condition(status.ConditionReady).Message, "no answer from its registry within 30s")
	})
	t.Logf("stall: %s: %s", n.Set("stall").Phase, n.Set("stall").Condition(status.ConditionReady).Message)
	if r := sd.Property("imagepind.service", "NRestarts"); r != "0" {
		t.Fatalf("imagepind restarted %s times while a registry stalled", r)
	}
	if now := sd.Property("imagepind.service", "MainPID"); now != pid {
		t.Fatalf("imagepind's pid changed: %s → %s", pid, now)
	}
	if asked.Load() == 0 {
		t.Fatal("the stalled registry was never asked: the test proves nothing")
	}
}

// hostPID maps a pid inside the systemd namespace to the host's.
func hostPID(t *testing.T, sd *env.Systemd, nsPID int) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "NSpid:") {
				f := strings.Fields(line)
				if len(f) == 3 && f[2] == strconv.Itoa(nsPID) && isDescendant(pid, sd.PID) {
					return pid
				}
			}
		}
	}
	t.Fatalf("no host pid for namespace pid %d", nsPID)
	return 0
}

func isDescendant(pid, ancestor int) bool {
	for pid > 1 {
		if pid == ancestor {
			return true
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false
		}
		f := strings.Fields(string(b)[strings.LastIndexByte(string(b), ')')+2:])
		pid, _ = strconv.Atoi(f[1])
	}
	return false
}
