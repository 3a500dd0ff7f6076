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
	"strconv"
	"strings"

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
// closed at once (logged once a minute at most is the caller's concern: each is logged
// at debug).
type Listener struct {
	net.Listener
	Allow func(uid int) bool
	Log   logrus.FieldLogger
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
		if l.Log != nil {
			e := l.Log.WithField("client", c.RemoteAddr().String())
			if err != nil {
				e = e.WithError(err)
			} else {
				e = e.WithField("uid", uid)
			}
			e.Warn("node-local mirror: refused a connection from a process that is not root (only the container runtime and imagepind read pinned images here)")
		}
		c.Close()
	}
}

// RootOrSelf allows root and the user this process runs as.
func RootOrSelf(uid int) bool { return uid == 0 || uid == os.Getuid() }
