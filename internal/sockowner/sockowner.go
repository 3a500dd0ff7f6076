// Package sockowner tells which user owns the other end of a loopback TCP connection,
// from the kernel's socket table (/proc/net/tcp and tcp6, whose uid column is the
// owner of each socket), and wraps a listener so that it accepts only the users it is
// told. The node-local mirror serves pinned images, private ones included (fetched
// with the node's pull secret), on a loopback port: only the container runtime and
// imagepind itself, both root, may read them, not every local process.
package sockowner

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
)

// ErrNotFound means the socket table holds no connection with these ends (it closed).
var ErrNotFound = errors.New("no such connection in the socket table")

// procNet is where the socket tables are (a test points it elsewhere).
var procNet = "/proc/net"

// Owner is the user owning the client end of c, a connection this process accepted:
// the socket whose local address is c's remote address and whose remote address is
// c's local address.
func Owner(c net.Conn) (int, error) {
	local, err1 := netip.ParseAddrPort(c.LocalAddr().String())
	remote, err2 := netip.ParseAddrPort(c.RemoteAddr().String())
	if err1 != nil || err2 != nil {
		return -1, fmt.Errorf("not a TCP connection: %s", c.RemoteAddr())
	}
	// An IPv4 client may also hold an IPv6 socket (an IPv4-mapped address): look in
	// the other table when the first has no such connection.
	tables := []string{"tcp", "tcp6"}
	if remote.Addr().Unmap().Is6() {
		tables = []string{"tcp6"}
	}
	for _, t := range tables {
		uid, err := owner(procNet+"/"+t, remote, local)
		if !errors.Is(err, ErrNotFound) {
			return uid, err
		}
	}
	return -1, ErrNotFound
}

// owner looks up the socket from → to in a socket table.
func owner(table string, from, to netip.AddrPort) (int, error) {
	f, err := os.Open(table)
	if err != nil {
		return -1, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 {
			continue
		}
		l, errl := parseAddr(fields[1])
		r, errr := parseAddr(fields[2])
		if errl != nil || errr != nil || l != from || r.Port() != to.Port() || r.Addr().Unmap() != to.Addr().Unmap() {
			continue
		}
		return strconv.Atoi(fields[7])
	}
	if err := sc.Err(); err != nil {
		return -1, err
	}
	return -1, ErrNotFound
}

// parseAddr reads the kernel's "0100007F:1F90": the address as 32-bit words in host
// (little-endian) order, then the port in hex.
func parseAddr(s string) (netip.AddrPort, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("bad socket address %q", s)
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, err
	}
	b, err := hex.DecodeString(a)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return netip.AddrPort{}, fmt.Errorf("bad socket address %q", s)
	}
	for i := 0; i < len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	addr, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(addr.Unmap(), uint16(port)), nil
}

// Listener accepts only connections whose client end a user in Allow owns; others are
// closed at once. The refusals are logged at Warn, at most one line per Every (0: a
// minute): the first at once, the others of the next Every as one line with their
// count and users when it ends (any local user may connect as often as it likes; the
// log does not grow with it).
type Listener struct {
	net.Listener
	Allow func(uid int) bool
	Log   logrus.FieldLogger
	Every time.Duration

	mu      sync.Mutex
	logged  time.Time      // when the last line was logged
	held    int            // refusals since, not logged yet
	heldBy  map[string]int // their users ("uid 1000", or the lookup's error), counted
	flusher *time.Timer    // logs the held refusals when Every has passed
}

// Accept returns the next allowed connection.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uid, err := Owner(c)
		if err == nil && l.Allow(uid) {
			return c, nil
		}
		who := fmt.Sprintf("uid %d", uid)
		if err != nil {
			who = err.Error()
		}
		l.refused(c.RemoteAddr().String(), who)
		c.Close()
	}
}

// Close closes the listener, logging the refusals not logged yet.
func (l *Listener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	if l.flusher != nil {
		l.flusher.Stop()
		l.flusher = nil
	}
	l.mu.Unlock()
	l.flush()
	return err
}

const refusedMsg = "node-local mirror: refused connections from processes that are not root (only the container runtime and imagepind read pinned images here)"

func (l *Listener) every() time.Duration {
	if l.Every > 0 {
		return l.Every
	}
	return time.Minute
}

// refused logs a refused connection from client (who: its user), or holds it for the
// next line.
func (l *Listener) refused(client, who string) {
	if l.Log == nil {
		return
	}
	l.mu.Lock()
	if l.held == 0 && time.Since(l.logged) >= l.every() {
		l.logged = time.Now()
		l.mu.Unlock()
		l.Log.WithField("client", client).WithField("user", who).Warn(refusedMsg)
		return
	}
	l.held++
	if l.heldBy == nil {
		l.heldBy = map[string]int{}
	}
	if _, ok := l.heldBy[who]; ok || len(l.heldBy) < 8 {
		l.heldBy[who]++
	}
	if l.flusher == nil {
		l.flusher = time.AfterFunc(time.Until(l.logged.Add(l.every())), func() {
			l.mu.Lock()
			l.flusher = nil
			l.mu.Unlock()
			l.flush()
		})
	}
	l.mu.Unlock()
}

// flush logs the refusals held, as one line.
func (l *Listener) flush() {
	l.mu.Lock()
	held, by := l.held, l.heldBy
	l.held, l.heldBy = 0, nil
	if held > 0 {
		l.logged = time.Now()
	}
	l.mu.Unlock()
	if held == 0 || l.Log == nil {
		return
	}
	users := make([]string, 0, len(by))
	for who, n := range by {
		users = append(users, fmt.Sprintf("%s ×%d", who, n))
	}
	sort.Strings(users)
	l.Log.WithField("refused", held).WithField("users", strings.Join(users, ", ")).Warn(refusedMsg)
}

// RootOrSelf allows root and the user this process runs as.
func RootOrSelf(uid int) bool { return uid == 0 || uid == os.Getuid() }
