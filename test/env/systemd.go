package env

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/dbus"
)

// Systemd is a real systemd running as PID 1 of a new PID and mount namespace, with a
// real dbus-daemon as the system bus, and only the units a test gives it.
type Systemd struct {
	Dir     string
	UnitDir string
	// PID is the namespace's PID 1 as seen from the host.
	PID int
	// Bus is the system bus address from the host.
	Bus string

	cmd     *exec.Cmd
	cgroup  string
	sysctls map[string]string
}

// cgroup2Root is where these machines mount the cgroup v2 hierarchy.
func cgroup2Root() (string, error) {
	for _, p := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err == nil {
			if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(b), " "+p+" ") && strings.Contains(string(b), "cgroup2") {
				return p, nil
			}
		}
	}
	return "", errors.New("no cgroup v2 hierarchy mounted")
}

var savedSysctls = []string{"fs/file-max", "net/unix/max_dgram_qlen", "fs/nr_open"}

// StartSystemd writes the base units (test.target, dbus.socket, dbus.service) plus the
// given ones (name → content; "x.service.d/y.conf" for drop-ins) and boots systemd.
func StartSystemd(dir string, units map[string]string) (*Systemd, error) {
	root, err := cgroup2Root()
	if err != nil {
		return nil, err
	}
	var id [4]byte
	rand.Read(id[:])
	s := &Systemd{Dir: dir, UnitDir: filepath.Join(dir, "units"), cgroup: filepath.Join(root, "imagepin-e2e-"+hex.EncodeToString(id[:])),
		sysctls: map[string]string{}}
	for _, k := range savedSysctls {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil {
			s.sysctls[k] = strings.TrimSpace(string(b))
		}
	}
	base := map[string]string{
		"test.target":  "[Unit]\nDescription=imagepin test\nDefaultDependencies=no\nWants=dbus.socket dbus.service\n",
		"system.slice": "[Unit]\nDescription=System Slice\nDefaultDependencies=no\n",
		"dbus.socket":  "[Unit]\nDescription=D-Bus System Message Bus Socket\nDefaultDependencies=no\n[Socket]\nListenStream=/run/dbus/system_bus_socket\n",
		"dbus.service": "[Unit]\nDescription=D-Bus System Message Bus\nDefaultDependencies=no\nRequires=dbus.socket\n[Service]\nType=notify\n" +
			"ExecStart=/usr/bin/dbus-daemon --config-file=/usr/share/dbus-1/system.conf --address=systemd: --nofork --nopidfile --systemd-activation --syslog-only\n",
	}
	for name, content := range units {
		base[name] = content
	}
	for name, content := range base {
		p := filepath.Join(s.UnitDir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return nil, err
		}
	}
	if err := os.Mkdir(s.cgroup, 0o755); err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	inner := filepath.Join(dir, "pid1.sh")
	os.WriteFile(inner, []byte(fmt.Sprintf(`#!/bin/sh
set -e
mount -t tmpfs tmpfs /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
exec env -i container=imagepin-test SYSTEMD_UNIT_PATH=%s: PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /lib/systemd/systemd --system --unit=test.target --log-target=console --log-level=warning
`, s.UnitDir)), 0o755)
	outer := filepath.Join(dir, "launch.sh")
	os.WriteFile(outer, []byte(fmt.Sprintf(`#!/bin/sh
echo $$ > %s/cgroup.procs
exec unshare --fork --pid --mount --uts --cgroup --mount-proc --propagation private %s
`, s.cgroup, inner)), 0o755)
	logf, err := os.Create(filepath.Join(dir, "systemd.log"))
	if err != nil {
		return nil, err
	}
	s.cmd = exec.Command(outer)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { s.cmd.Wait(); logf.Close() }()

	// The namespace's PID 1 is the child of unshare (the launch script's pid after exec).
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if pid := childOf(s.cmd.Process.Pid); pid > 0 {
			s.PID = pid
			sock := fmt.Sprintf("/proc/%d/root/run/dbus/system_bus_socket", pid)
			if _, err := os.Stat(sock); err == nil {
				s.Bus = "unix:path=" + sock
				if err := s.waitBus(); err == nil {
					return s, nil
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	log, _ := os.ReadFile(filepath.Join(dir, "systemd.log"))
	s.Stop()
	return nil, fmt.Errorf("systemd did not come up with a bus within 20s:\n%s", log)
}

func childOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(f[0])
	return n
}

// Conn opens a connection to this systemd over its system bus.
func (s *Systemd) Conn(ctx context.Context) (*dbus.Conn, error) {
	os.Setenv("DBUS_SYSTEM_BUS_ADDRESS", s.Bus)
	return dbus.NewSystemConnectionContext(ctx)
}

func (s *Systemd) waitBus() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := s.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.GetUnitPropertyContext(ctx, "test.target", "ActiveState")
	return err
}

// Systemctl runs systemctl inside the namespace.
func (s *Systemd) Systemctl(args ...string) (string, error) {
	full := append([]string{"-t", strconv.Itoa(s.PID), "-m", "-p", "systemctl"}, args...)
	out, err := exec.Command("nsenter", full...).CombinedOutput()
	return string(out), err
}

// Property reads one unit property as systemctl show prints it.
func (s *Systemd) Property(unit, prop string) string {
	out, _ := s.Systemctl("show", "-p", prop, "--value", unit)
	return strings.TrimSpace(out)
}

// Start starts a unit and waits for the job.
func (s *Systemd) Start(unit string) error {
	out, err := s.Systemctl("start", unit)
	if err != nil {
		return fmt.Errorf("systemctl start %s: %v: %s", unit, err, out)
	}
	return nil
}

// Stop stops everything: kills the namespace's PID 1 (which takes every process in the
// namespace with it), removes the cgroup and restores the sysctls systemd raised.
func (s *Systemd) Stop() {
	if s.PID > 0 {
		s.Systemctl("stop", "imagepind.service", "crio.service")
		syscall.Kill(s.PID, syscall.SIGKILL)
	}
	if s.cmd != nil && s.cmd.Process != nil {
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if err := os.Remove(s.cgroup); err == nil || os.IsNotExist(err) {
			break
		}
		removeCgroupTree(s.cgroup)
		time.Sleep(50 * time.Millisecond)
	}
	for k, v := range s.sysctls {
		os.WriteFile("/proc/sys/"+k, []byte(v), 0o644)
	}
	os.Unsetenv("DBUS_SYSTEM_BUS_ADDRESS")
}

func removeCgroupTree(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() {
			removeCgroupTree(filepath.Join(dir, e.Name()))
		}
	}
	os.Remove(dir)
}
