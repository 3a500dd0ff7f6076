//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
)

// runtimeSnapshot is every runtime config path imagepind may write, with each file's
// mode, owner and bytes ("absent" for a path that is not there).
func runtimeSnapshot(t *testing.T, roots ...string) string {
	t.Helper()
	var b strings.Builder
	for _, r := range roots {
		if _, err := os.Lstat(r); os.IsNotExist(err) {
			fmt.Fprintf(&b, "%s absent\n", r)
			continue
		}
		fmt.Fprintf(&b, "== %s\n%s", r, snapshot(t, r))
	}
	return b.String()
}

// lineDiff is the lines of a not in b (-) and of b not in a (+).
func lineDiff(a, b string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	ia, ib := in(a), in(b)
	var out strings.Builder
	for _, l := range strings.Split(a, "\n") {
		if !ib[l] {
			out.WriteString("- " + l + "\n")
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if !ia[l] {
			out.WriteString("+ " + l + "\n")
		}
	}
	return out.String()
}

// uninstall runs imagepind uninstall with the world's config and returns its exit code
// and output.
func (w *world) uninstall(args ...string) (int, string) {
	w.t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "imagepind"), append([]string{"uninstall", "--config=" + w.config}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		}
		w.t.Fatal(err)
	}
	return 0, string(out)
}

// On CRI-O, with the node-local mirror and its tag endpoint on: imagepind uninstall is
// refused while the daemon runs; once it is stopped, it gives the node back: crio.conf.d,
// registries.conf.d (an administrator's drop-in in it) and certs.d byte-identical to
// before imagepind first ran, with modes and owners, CRI-O reloaded once, the pinned
// images still there and no longer pinned, the state and blob store gone but the
// receipt --status reads.
func TestUninstallCRIO(t *testing.T) {
	w := newWorld(t)
	admin := filepath.Join(w.crio.RegistriesConfDir(), "50-admin.conf")
	if err := os.WriteFile(admin, []byte("# the administrator's\nunqualified-search-registries = []"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chown(admin, 4321, 4321)
	roots := []string{w.crio.Config, w.crio.ConfigDir, w.crio.RegistriesConf(), w.crio.RegistriesConfDir(), w.crio.CertsDir()}
	before := runtimeSnapshot(t, roots...)
	mport, _ := env.FreePort()
	tport, _ := env.FreePort()
	w.writeConfig(worldOptions{extra: fmt.Sprintf("[peers]\nenabled = true\nmirror_address = \"127.0.0.1:%d\"\ntag_address = \"127.0.0.1:%d\"\n", mport, tport)})
	refs := w.push("uninstall", 2)
	w.startDaemon()
	w.writeSet("u.yaml", alphaSet("u", refs...))
	w.waitFor("u Ready", 90*time.Second, phaseIs("u", status.Ready))
	w.requirePinned(refs...)
	during := runtimeSnapshot(t, roots...)
	if during == before {
		t.Fatal("imagepind wrote none of the runtime's files: the test proves nothing")
	}
	t.Logf("what imagepind changed:\n%s", lineDiff(before, during))

	if code, out := w.uninstall(); code != 1 || !strings.Contains(out, "stop it first") {
		t.Fatalf("uninstall while imagepind runs: exit %d, want 1 naming it:\n%s", code, out)
	}
	if after := runtimeSnapshot(t, roots...); after != during {
		t.Fatalf("the refused uninstall changed files:\n%s", lineDiff(during, after))
	}
	w.stopDaemon()
	// The daemon's SIGTERM/SIGINT keeps every pin.
	w.requirePinned(refs...)
	reloads := strings.Count(w.crio.LogTail(1<<20), "Reloading configuration")
	code, out := w.uninstall()
	if code != 0 {
		t.Fatalf("imagepind uninstall: exit %d\n%s", code, out)
	}
	t.Logf("imagepind uninstall:\n%s", out)
	after := runtimeSnapshot(t, roots...)
	diff := lineDiff(before, after)
	t.Logf("diff of the runtime's configuration, before imagepind first ran against after uninstall (empty: none):\n%s", diff)
	if after != before {
		t.Fatalf("not byte-identical:\n%s", diff)
	}
	waitUntil(t, "CRI-O's reload", 10*time.Second, func() bool {
		return strings.Count(w.crio.LogTail(1<<20), "Reloading configuration") > reloads
	})
	time.Sleep(time.Second)
	if n := strings.Count(w.crio.LogTail(1<<20), "Reloading configuration") - reloads; n != 1 {
		t.Fatalf("CRI-O reloaded %d times, want once", n)
	}
	for _, r := range refs {
		img := w.image(r)
		if !img.Present {
			t.Fatalf("%s is gone; the images stay", r)
		}
		if img.Pinned {
			t.Fatalf("%s is still pinned", r)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(w.dir, "state")); len(entries) != 2 {
		t.Errorf("state left: %v, want the lock and the receipt", entries)
	}
	code, out = w.uninstall("--status")
	if code != 0 || !strings.Contains(out, "given back") {
		t.Fatalf("--status: exit %d\n%s", code, out)
	}
	t.Logf("imagepind uninstall --status:\n%s", out)
	// Again: nothing more to do, no second reload.
	if code, out := w.uninstall(); code != 0 {
		t.Fatalf("second uninstall: exit %d\n%s", code, out)
	}
	if runtimeSnapshot(t, roots...) != before {
		t.Fatal("the second uninstall changed files")
	}
}

// On containerd with the node-local mirror on: the administrator's hosts.toml of the
// registry (mode 0640, another owner) imagepind put its block in comes back byte for
// byte, the pins imagepind set are released (the images stay), nothing is reloaded.
func TestUninstallContainerd(t *testing.T) {
	w := newContainerdWorld(t, nil)
	dirName := strings.Replace(w.reg.Host, ":", "_", 1) + "_"
	file := filepath.Join(w.ctr.HostsDir, dirName, "hosts.toml")
	text := fmt.Sprintf("# the administrator's\nserver = \"http://%[1]s\"\n\n[host.\"http://%[1]s\"]\n  capabilities = [\"pull\", \"resolve\"]", w.reg.Host)
	if err := os.WriteFile(file, []byte(text), 0o640); err != nil {
		t.Fatal(err)
	}
	os.Chmod(file, 0o640)
	os.Chown(file, 4321, 4321)
	before := runtimeSnapshot(t, w.ctr.HostsDir)
	mport, _ := env.FreePort()
	w.writeConfig(worldOptions{extra: fmt.Sprintf("[peers]\nenabled = true\nmirror_address = \"127.0.0.1:%d\"\n", mport)})
	refs := w.push("uninstall", 2)
	w.startDaemon()
	w.writeSet("u.yaml", alphaSet("u", refs...))
	w.waitFor("u Ready", 90*time.Second, phaseIs("u", status.Ready))
	for _, r := range refs {
		if !w.labelled(r) {
			t.Fatalf("%s is not pinned", r)
		}
	}
	during := runtimeSnapshot(t, w.ctr.HostsDir)
	if during == before {
		t.Fatal("imagepind wrote no hosts.toml: the test proves nothing")
	}
	t.Logf("what imagepind changed:\n%s", lineDiff(before, during))
	w.stopDaemon()
	for _, r := range refs {
		if !w.labelled(r) {
			t.Fatalf("%s was unpinned by the daemon's stop", r)
		}
	}
	code, out := w.uninstall()
	if code != 0 {
		t.Fatalf("imagepind uninstall: exit %d\n%s", code, out)
	}
	t.Logf("imagepind uninstall:\n%s", out)
	after := runtimeSnapshot(t, w.ctr.HostsDir)
	diff := lineDiff(before, after)
	t.Logf("diff of containerd's hosts directory, before imagepind first ran against after uninstall (empty: none):\n%s", diff)
	if after != before {
		t.Fatalf("not byte-identical:\n%s", diff)
	}
	for _, r := range refs {
		if w.labelled(r) {
			t.Fatalf("%s is still pinned", r)
		}
		if img := w.image(r); !img.Present || img.Pinned {
			t.Fatalf("%s: %+v, want present and not pinned", r, img)
		}
	}
	if code, out := w.uninstall("--status"); code != 0 {
		t.Fatalf("--status: exit %d\n%s", code, out)
	}
}
