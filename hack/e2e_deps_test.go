// Package hack_test runs the package step of hack/e2e-deps.sh (install_packages) in a
// sandbox: the script sourced with its root set to a temporary directory, and apt-get,
// systemctl and docker-registry's init script replaced by fakes that act as Debian's do
// (the package's postinst asks policy-rc.d, then starts the service).
package hack_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeAptGet is apt-get: update does nothing; install records the policy-rc.d it sees,
// runs docker-registry's postinst as invoke-rc.d would (start unless policy-rc.d says
// 101), then ends as FAKE_APT says: ok, fail, hang (until $LOG/apt-release exists), or
// replace (another policy-rc.d put in place, by rename, as an administrator might).
const fakeAptGet = `#!/bin/sh
[ "$1" = update ] && exit 0
policy="$ROOT/usr/sbin/policy-rc.d"
if [ -e "$policy" ]; then cat "$policy" > "$LOG/policy-during-install"; fi
for p in "$@"; do
  [ "$p" = docker-registry ] || continue
  rc=0
  if [ -x "$policy" ]; then "$policy" docker-registry start || rc=$?; fi
  if [ "$rc" = 0 ] || [ "$rc" = 104 ]; then "$ROOT/etc/init.d/docker-registry" start; fi
done
case "$FAKE_APT" in
  fail) exit 100 ;;
  hang) : > "$LOG/apt-running"; while [ ! -e "$LOG/apt-release" ]; do sleep 0.02; done ;;
  replace) printf '#!/bin/sh\nexit 0\n' > "$policy.new"; chmod 0755 "$policy.new"; mv "$policy.new" "$policy" ;;
esac
exit 0
`

// fakeInit is docker-registry's init script: the service runs while the marker exists.
const fakeInit = `#!/bin/sh
echo "init.d $1" >> "$LOG/calls"
case "$1" in
  start) : > "$ROOT/run/docker-registry.running" ;;
  stop) [ -e "$ROOT/run/docker-registry.running" ] || exit 1; rm "$ROOT/run/docker-registry.running" ;;
esac
`

const fakeSystemctl = `#!/bin/sh
echo "systemctl $*" >> "$LOG/calls"
[ "$1" = stop ] && rm -f "$ROOT/run/docker-registry.running"
exit 0
`

// driver sources the script and runs its package step with the sandbox's root.
const driver = `set -euo pipefail
source "$SCRIPT"
root=$ROOT
install_packages "$@"
: > "$LOG/finished"
`

type sandbox struct {
	t                *testing.T
	root, log, fakes string
	policy           string
}

func newSandbox(t *testing.T) *sandbox {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is not installed")
	}
	dir := t.TempDir()
	s := &sandbox{t: t, root: filepath.Join(dir, "root"), log: filepath.Join(dir, "log"), fakes: filepath.Join(dir, "bin")}
	s.policy = filepath.Join(s.root, "usr", "sbin", "policy-rc.d")
	for _, d := range []string{filepath.Dir(s.policy), filepath.Join(s.root, "etc", "init.d"), filepath.Join(s.root, "run"), s.log, s.fakes} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for file, text := range map[string]string{
		filepath.Join(s.fakes, "apt-get"):                         fakeAptGet,
		filepath.Join(s.fakes, "systemctl"):                       fakeSystemctl,
		filepath.Join(s.root, "etc", "init.d", "docker-registry"): fakeInit,
	} {
		if err := os.WriteFile(file, []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// start runs install_packages pkgs in its own process group, apt-get acting as mode.
func (s *sandbox) start(mode string, pkgs ...string) (*exec.Cmd, *bytes.Buffer) {
	s.t.Helper()
	script, err := filepath.Abs("e2e-deps.sh")
	if err != nil {
		s.t.Fatal(err)
	}
	cmd := exec.Command("bash", append([]string{"-c", driver, "bash"}, pkgs...)...)
	cmd.Env = append(os.Environ(), "PATH="+s.fakes+":"+os.Getenv("PATH"), "SCRIPT="+script, "ROOT="+s.root, "LOG="+s.log, "FAKE_APT="+mode)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	pid := cmd.Process.Pid
	s.t.Cleanup(func() {
		if cmd.ProcessState == nil { // still running: the group this test started
			syscall.Kill(-pid, syscall.SIGKILL)
			cmd.Wait()
		}
	})
	return cmd, &out
}

// run runs install_packages to its end and returns its exit code.
func (s *sandbox) run(mode string, pkgs ...string) (int, string) {
	s.t.Helper()
	cmd, out := s.start(mode, pkgs...)
	err := cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		s.t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// skipIfIgnored skips a test of sig where this process ignores it: inherited (a
// background job of a non-interactive shell, nohup), so the script's bash would too, and
// bash cannot trap a signal ignored on entry.
func skipIfIgnored(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if signal.Ignored(sig) {
		t.Skipf("%v is ignored in this process, and so in the script", sig)
	}
}

// wait waits for cmd to end, 10 s at most (then its process group is killed).
func (s *sandbox) wait(cmd *exec.Cmd) {
	s.t.Helper()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		s.t.Fatal("the script did not end within 10 s of the signal")
	}
}

func (s *sandbox) exists(file string) bool {
	_, err := os.Lstat(file)
	return err == nil
}

func (s *sandbox) read(name string) string {
	b, _ := os.ReadFile(filepath.Join(s.log, name))
	return string(b)
}

// waitFor waits until the log directory holds name.
func (s *sandbox) waitFor(name string) {
	s.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if s.exists(filepath.Join(s.log, name)) {
			return
		}
	}
	s.t.Fatalf("%s never appeared", name)
}

func (s *sandbox) writePolicy(text string) {
	s.t.Helper()
	if err := os.WriteFile(s.policy, []byte(text), 0o755); err != nil {
		s.t.Fatal(err)
	}
}

// requirePolicy checks policy-rc.d holds text with mode 0755.
func (s *sandbox) requirePolicy(text string) {
	s.t.Helper()
	b, err := os.ReadFile(s.policy)
	fi, _ := os.Lstat(s.policy)
	if err != nil || string(b) != text || fi.Mode() != 0o755 {
		s.t.Fatalf("policy-rc.d: %v, %q (%v); want %q, as it was", err, b, fi, text)
	}
}

// requireOursDuringInstall checks apt-get ran with this run's policy-rc.d refusing starts.
func (s *sandbox) requireOursDuringInstall() {
	s.t.Helper()
	if p := s.read("policy-during-install"); !strings.Contains(p, "written by imagepin hack/e2e-deps.sh") || !strings.HasSuffix(p, "exit 101\n") {
		s.t.Fatalf("apt-get ran with policy-rc.d %q, want the script's, exit 101", p)
	}
}

const (
	allowing = "#!/bin/sh\n# the administrator's: services start\nexit 0\n"
	refusing = "#!/bin/sh\n# as in Docker's Debian images\nexit 101\n"
)

// With no policy-rc.d, the run writes one that refuses starts for the install and removes
// it after: docker-registry's service never starts, nothing is stopped, and the service
// is disabled at boot.
func TestInstallRefusesServiceStartsForItsOwnRun(t *testing.T) {
	s := newSandbox(t)
	code, out := s.run("ok", "docker-registry", "skopeo")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	s.requireOursDuringInstall()
	if s.exists(s.policy) {
		t.Fatalf("the policy-rc.d this run wrote is still there")
	}
	if calls := s.read("calls"); strings.Contains(calls, "init.d start") || strings.Contains(calls, "stop") || !strings.Contains(calls, "systemctl disable docker-registry") {
		t.Fatalf("calls:\n%s", calls)
	}
}

// A policy-rc.d that was there before is used as it is and left as it was. Where it lets
// the service start, the run stops the service its install started, through the
// package's own init script (or systemd's unit where systemd runs).
func TestInstallKeepsAPolicyItDidNotWrite(t *testing.T) {
	for _, c := range []struct {
		name, policy string
		systemd      bool
	}{{"allowing", allowing, false}, {"allowing under systemd", allowing, true}, {"refusing", refusing, false}} {
		t.Run(c.name, func(t *testing.T) {
			s := newSandbox(t)
			s.writePolicy(c.policy)
			if c.systemd {
				os.MkdirAll(filepath.Join(s.root, "run", "systemd", "system"), 0o755)
			}
			code, out := s.run("ok", "docker-registry")
			if code != 0 {
				t.Fatalf("exit %d:\n%s", code, out)
			}
			s.requirePolicy(c.policy)
			if s.exists(filepath.Join(s.root, "run", "docker-registry.running")) {
				t.Fatalf("the docker-registry service this run's install started still runs; calls:\n%s", s.read("calls"))
			}
			calls := s.read("calls")
			stop := "init.d stop"
			if c.systemd {
				stop = "systemctl stop docker-registry.service"
			}
			if !strings.Contains(calls, stop) || !strings.Contains(calls, "systemctl disable docker-registry") {
				t.Fatalf("calls:\n%s\nwant %q and the unit disabled", calls, stop)
			}
		})
	}
}

// docker-registry installed before the run (not in the list): its service is the
// administrator's, neither stopped nor disabled.
func TestInstallLeavesAnInstalledRegistryAlone(t *testing.T) {
	s := newSandbox(t)
	s.writePolicy(allowing)
	if code, out := s.run("ok", "skopeo"); code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	s.requirePolicy(allowing)
	if calls := s.read("calls"); calls != "" {
		t.Fatalf("calls:\n%s", calls)
	}
}

// A failed install, and an install interrupted by a signal to the script's process
// group (^C on a terminal), remove this run's policy-rc.d.
func TestInterruptedInstallRemovesItsPolicy(t *testing.T) {
	t.Run("apt-get fails", func(t *testing.T) {
		s := newSandbox(t)
		code, out := s.run("fail", "docker-registry")
		if code != 100 || s.exists(filepath.Join(s.log, "finished")) {
			t.Fatalf("exit %d, want apt-get's 100:\n%s", code, out)
		}
		s.requireOursDuringInstall()
		if s.exists(s.policy) {
			t.Fatal("the policy-rc.d this run wrote is still there after apt-get failed")
		}
	})
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			skipIfIgnored(t, sig)
			s := newSandbox(t)
			cmd, out := s.start("hang", "docker-registry")
			s.waitFor("apt-running")
			s.requireOursDuringInstall()
			if err := syscall.Kill(-cmd.Process.Pid, sig); err != nil {
				t.Fatal(err)
			}
			s.wait(cmd)
			if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != sig {
				t.Fatalf("the script ended %v, want killed by %v:\n%s", cmd.ProcessState, sig, out)
			}
			if s.exists(s.policy) {
				t.Fatalf("the policy-rc.d this run wrote is still there after %v", sig)
			}
		})
	}
	// SIGTERM to the script alone: apt-get goes on, with the policy in place, and the
	// policy goes when it returns; nothing after the install runs.
	t.Run("SIGTERM to the script alone", func(t *testing.T) {
		skipIfIgnored(t, syscall.SIGTERM)
		s := newSandbox(t)
		cmd, out := s.start("hang", "docker-registry")
		s.waitFor("apt-running")
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		if !s.exists(s.policy) {
			t.Fatal("the policy-rc.d was removed while apt-get still runs")
		}
		os.WriteFile(filepath.Join(s.log, "apt-release"), nil, 0o644)
		s.wait(cmd)
		if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
			t.Fatalf("the script ended %v, want killed by SIGTERM:\n%s", cmd.ProcessState, out)
		}
		if s.exists(s.policy) {
			t.Fatal("the policy-rc.d this run wrote is still there")
		}
		if calls := s.read("calls"); strings.Contains(calls, "systemctl") {
			t.Fatalf("the script went on after SIGTERM:\n%s", calls)
		}
	})
	// An interruption never removes a policy-rc.d that was there before.
	t.Run("SIGTERM with the administrator's policy", func(t *testing.T) {
		skipIfIgnored(t, syscall.SIGTERM)
		s := newSandbox(t)
		s.writePolicy(refusing)
		cmd, _ := s.start("hang", "docker-registry")
		s.waitFor("apt-running")
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		s.wait(cmd)
		s.requirePolicy(refusing)
	})
}

// A policy-rc.d put in place of this run's during the install (another file now), and a
// dangling link where none was, are not this run's: neither is removed or written
// through.
func TestInstallRemovesOnlyWhatItWrote(t *testing.T) {
	t.Run("replaced during the install", func(t *testing.T) {
		s := newSandbox(t)
		if code, out := s.run("replace", "skopeo"); code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		s.requireOursDuringInstall()
		s.requirePolicy("#!/bin/sh\nexit 0\n")
	})
	t.Run("a dangling link", func(t *testing.T) {
		s := newSandbox(t)
		target := filepath.Join(s.root, "elsewhere", "policy") // its directory there: a write through would succeed
		os.MkdirAll(filepath.Dir(target), 0o755)
		if err := os.Symlink(target, s.policy); err != nil {
			t.Fatal(err)
		}
		if code, out := s.run("ok", "skopeo"); code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		if l, err := os.Readlink(s.policy); err != nil || l != target || s.exists(target) {
			t.Fatalf("the link: %q %v; its target written: %v", l, err, s.exists(target))
		}
	})
}
