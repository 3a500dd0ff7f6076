package sockowner

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
)

// The connection's client end is found in the real socket table, owned by this test's
// user.
func TestOwnerOfALoopbackConnection(t *testing.T) {
	for _, network := range []string{"127.0.0.1:0", "[::1]:0"} {
		l, err := net.Listen("tcp", network)
		if err != nil {
			t.Logf("%s: %v (no such loopback here)", network, err)
			continue
		}
		defer l.Close()
		go func() {
			c, err := net.Dial("tcp", l.Addr().String())
			if err == nil {
				time.Sleep(time.Second)
				c.Close()
			}
		}()
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		uid, err := Owner(c)
		c.Close()
		if err != nil || uid != os.Getuid() {
			t.Errorf("%s: owner %d, %v; want %d", network, uid, err, os.Getuid())
		}
	}
}

// A connection of a user not allowed is closed before the server sees it; an allowed
// one is handed on.
func TestListenerRefusesOtherUsers(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	allow := make(chan bool, 2)
	allow <- false
	allow <- true
	sl := &Listener{Listener: l, Allow: func(uid int) bool { return <-allow }}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := sl.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	refused, _ := net.Dial("tcp", l.Addr().String())
	buf := make([]byte, 1)
	refused.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := refused.Read(buf); err == nil {
		t.Fatal("the refused connection stays open")
	}
	ok, _ := net.Dial("tcp", l.Addr().String())
	defer ok.Close()
	select {
	case c := <-accepted:
		if c.RemoteAddr().String() != ok.LocalAddr().String() {
			t.Errorf("accepted %s, want %s", c.RemoteAddr(), ok.LocalAddr())
		}
		c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the allowed connection was not accepted")
	}
}

// The kernel's table format: IPv4 and IPv6 words in host order, the uid in column 8.
func TestOwnerReadsTheKernelsTable(t *testing.T) {
	table := filepath.Join(t.TempDir(), "tcp")
	os.WriteFile(table, []byte(`  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F13 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:D431 0100007F:1F13 01 00000000:00000000 00:00000000 00000000  1000        0 2 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:1F13 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 20 4 30 10 -1
`), 0o644)
	uid, err := owner(table, netip.MustParseAddrPort("127.0.0.1:54321"), netip.MustParseAddrPort("127.0.0.1:7955"))
	if err != nil || uid != 1000 {
		t.Fatalf("owner %d, %v; want 1000", uid, err)
	}
	if _, err := owner(table, netip.MustParseAddrPort("127.0.0.1:1"), netip.MustParseAddrPort("127.0.0.1:7955")); err != ErrNotFound {
		t.Fatalf("a connection not in the table: %v", err)
	}
	a, err := parseAddr("0000000000000000FFFF00000100007F:1F13")
	if err != nil || a != netip.MustParseAddrPort("127.0.0.1:7955") {
		t.Fatalf("an IPv4-mapped IPv6 address: %v, %v", a, err)
	}
	a, err = parseAddr("00000000000000000000000001000000:1F13")
	if err != nil || a != netip.MustParseAddrPort("[::1]:7955") {
		t.Fatalf("::1: %v, %v", a, err)
	}
}

// Refused connections are logged at most once per Every: the first at once, the others
// of the next Every as one line with their count. Any local user may connect as often as
// it likes; the log does not grow with it.
func TestRefusalsAreLoggedOncePerEvery(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log, hook := logtest.NewNullLogger()
	sl := &Listener{Listener: l, Allow: func(int) bool { return false }, Log: log, Every: 2 * time.Second}
	defer sl.Close()
	go sl.Accept() // refuses every connection; returns when closed
	const tries = 50
	for range tries {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("a refused connection stays open")
		}
		c.Close()
	}
	if n := len(hook.AllEntries()); n != 1 {
		t.Fatalf("%d lines logged for %d refused connections at once, want 1", n, tries)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(hook.AllEntries()) < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	entries := hook.AllEntries()
	if len(entries) != 2 {
		t.Fatalf("%d lines after Every, want 2 (the first, then the rest counted)", len(entries))
	}
	last := entries[1]
	if last.Level != logrus.WarnLevel || last.Data["refused"] != tries-1 || !strings.Contains(fmt.Sprint(last.Data["users"]), fmt.Sprintf("uid %d ×%d", os.Getuid(), tries-1)) {
		t.Fatalf("the second line: %s %v", last.Level, last.Data)
	}
}
