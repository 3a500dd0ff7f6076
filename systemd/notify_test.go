package systemd

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// listen stands in for systemd's notify socket and returns what it receives.
func listen(t *testing.T) func() string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return func() string {
		buf := make([]byte, 4096)
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("nothing sent to the notify socket: %v", err)
		}
		return string(buf[:n])
	}
}

func TestNotifierSpeaksSdNotify(t *testing.T) {
	next := listen(t)
	var n Notifier
	for _, c := range []struct {
		call func()
		want string
	}{
		{n.Ready, "READY=1"},
		{func() { n.Status("2 sets Ready") }, "STATUS=2 sets Ready"},
		{n.Watchdog, "WATCHDOG=1"},
		{n.Stopping, "STOPPING=1"},
	} {
		c.call()
		if got := next(); got != c.want {
			t.Fatalf("sent %q, want %q", got, c.want)
		}
	}
}

func TestWatchdogIntervalIsHalfOfWatchdogSec(t *testing.T) {
	var n Notifier
	t.Setenv("WATCHDOG_USEC", "")
	t.Setenv("WATCHDOG_PID", "")
	if d := n.WatchdogInterval(); d != 0 {
		t.Fatalf("without WatchdogSec: %s, want 0", d)
	}
	t.Setenv("WATCHDOG_USEC", "4000000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	if d := n.WatchdogInterval(); d != 2*time.Second {
		t.Fatalf("WatchdogSec=4s: %s, want 2s", d)
	}
	// Meant for another process (a child that inherited the environment): not ours.
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()+1))
	if d := n.WatchdogInterval(); d != 0 {
		t.Fatalf("WATCHDOG_PID of another process: %s, want 0", d)
	}
}
