package env

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Proxy forwards TCP connections on loopback to the first backend that accepts one, as a
// Service does to its ready endpoints (a standby aggregator does not listen). Cut drops
// every connection and refuses new ones until Restore: a node cut off from the API.
type Proxy struct {
	Addr     string
	backends []string
	l        net.Listener
	// Down counts the bytes sent from the backends to the clients: what crossed the
	// link toward the nodes.
	Down atomic.Int64
	// Requests counts the client writes (HTTP requests, roughly) that crossed.
	Requests atomic.Int64
	// link, when set, is one token bucket for every connection (a site's uplink is one
	// link for all its nodes), and latency is added to each request.
	link    *rate.Limiter
	latency time.Duration

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool
}

// StartLink is a proxy to backend that emulates a site's shared uplink: bytesPerSecond
// for all connections together, latency added to each request, and counts.
func StartLink(backend string, bytesPerSecond int64, latency time.Duration) (*Proxy, error) {
	p, err := StartProxy(backend)
	if err != nil {
		return nil, err
	}
	if bytesPerSecond > 0 {
		p.link = rate.NewLimiter(rate.Limit(bytesPerSecond), 32<<10)
	}
	p.latency = latency
	return p, nil
}

// StartProxy listens on a free loopback port.
func StartProxy(backends ...string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: l.Addr().String(), backends: backends, l: l, conns: map[net.Conn]bool{}}
	go p.serve()
	return p, nil
}

func (p *Proxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *Proxy) handle(c net.Conn) {
	p.mu.Lock()
	cut := p.cut
	p.mu.Unlock()
	if cut {
		c.Close()
		return
	}
	var up net.Conn
	for _, b := range p.backends {
		if u, err := net.DialTimeout("tcp", b, time.Second); err == nil {
			up = u
			break
		}
	}
	if up == nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { p.copy(up, c, false); done <- struct{}{} }()
	go func() { p.copy(c, up, true); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// Cut drops every connection and refuses new ones.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
}

// Restore accepts connections again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Close stops the proxy.
func (p *Proxy) Close() {
	p.l.Close()
	p.Cut()
}

// copy moves bytes one way: down (backend to client) is counted and paced by the link;
// up (a request) waits the latency first.
func (p *Proxy) copy(dst, src net.Conn, down bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if down {
				if p.link != nil {
					if p.link.WaitN(context.Background(), n) != nil {
						return
					}
				}
				p.Down.Add(int64(n))
			} else {
				p.Requests.Add(1)
				if p.latency > 0 {
					time.Sleep(p.latency)
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
