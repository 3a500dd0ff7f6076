package crio

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// SignalReloader makes CRI-O re-read its config by sending SIGHUP to the process that
// owns its socket, found with SO_PEERCRED (what `systemctl reload crio` does, minus
// systemd).
type SignalReloader struct {
	Socket string
}

// Reload sends SIGHUP to CRI-O.
func (s SignalReloader) Reload(ctx context.Context) error {
	pid, err := PeerPID(ctx, s.Socket)
	if err != nil {
		return err
	}
	// A socket-activated listener is owned by PID 1: SIGHUP there would reload systemd.
	if pid <= 1 || pid == os.Getpid() {
		return fmt.Errorf("reload by signal: socket %s is owned by pid %d, not by CRI-O", s.Socket, pid)
	}
	if err := unix.Kill(pid, unix.SIGHUP); err != nil {
		return fmt.Errorf("reload by signal: SIGHUP to pid %d: %w", pid, err)
	}
	return nil
}

// String names the method for logs and metrics.
func (SignalReloader) String() string { return "signal" }

// PeerPID returns the pid of the process on the other end of a unix socket.
func PeerPID(ctx context.Context, socket string) (int, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return 0, fmt.Errorf("connect to %s: %w", socket, err)
	}
	defer conn.Close()
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return 0, errors.New("not a unix socket connection")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, fmt.Errorf("SO_PEERCRED on %s: %w", socket, credErr)
	}
	return int(cred.Pid), nil
}
