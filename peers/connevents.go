package peers

import (
	"bytes"
	"crypto/tls"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
)

// connEvents counts what ended or broke a node's peer connections, by kind: its
// requests whose connection ended under them (every request on a connection ends
// "unexpected EOF" when the other end closes it), its server's HTTP/2 error codes
// (http.HTTP2Config.CountError; net/http's client takes none), the connections its
// server closed before their first request, and the errors Go's server logs (a TLS
// handshake that failed, and why; a connection dropped because its first frames were
// not read within 2 s).
type connEvents struct {
	m sync.Map // kind → *atomic.Int64
}

func (c *connEvents) add(kind string) {
	v, ok := c.m.Load(kind)
	if !ok {
		v, _ = c.m.LoadOrStore(kind, new(atomic.Int64))
	}
	v.(*atomic.Int64).Add(1)
}

// ConnEvents are the counts of what ended or broke this node's peer connections so
// far, by kind ("client: connection ended before an answer", "server http: TLS
// handshake error: EOF", …).
func (s *Stats) ConnEvents() map[string]int64 {
	out := map[string]int64{}
	s.conns.m.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return out
}

// serverConnEvents counts, for srv, the server side: its HTTP/2 errors, the
// connections closed before a first request, and what Go's server logs (sent to the
// node's log at debug level, counted by kind).
func (s *Server) serverConnEvents(srv *http.Server) {
	stats := s.Stats
	if stats == nil {
		return
	}
	srv.HTTP2.CountError = func(code string) { stats.conns.add("server " + code) }
	var active sync.Map // net.Conn → struct{}: connections that had a request
	srv.ConnState = func(c net.Conn, st http.ConnState) {
		switch st {
		case http.StateActive:
			active.Store(c, struct{}{})
		case http.StateClosed, http.StateHijacked:
			if _, ok := active.LoadAndDelete(c); ok {
				return
			}
			kind := "server closed a connection before its first request"
			if tc, ok := c.(*tls.Conn); ok && !tc.ConnectionState().HandshakeComplete {
				kind += " (handshake not complete)"
			}
			stats.conns.add(kind)
		}
	}
	srv.ErrorLog = log.New(serverLog{stats: stats, s: s}, "", 0)
}

// serverLog takes the lines Go's HTTP server logs.
type serverLog struct {
	stats *Stats
	s     *Server
}

func (l serverLog) Write(p []byte) (int, error) {
	line := string(bytes.TrimSpace(p))
	kind := line
	// "http: TLS handshake error from 10.0.0.5:41234: EOF", "timeout waiting for
	// SETTINGS frames from 10.0.0.5:41234": the kind without the address.
	if i := strings.Index(line, " from "); i >= 0 {
		kind = line[:i]
		rest := line[i+len(" from "):]
		if j := strings.Index(rest, ": "); j >= 0 {
			kind += ": " + rest[j+2:]
		}
	}
	if len(kind) > 80 {
		kind = kind[:80] + "…"
	}
	l.stats.conns.add("server " + kind)
	if l.s.Log != nil {
		l.s.Log.Debug(line)
	}
	return len(p), nil
}
