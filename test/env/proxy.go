package env

import (
	"io"
	"net"
	"sync"
	"time"
)

// Proxy forwards TCP connections on loopback to the first backend that accepts one, as a
// Service does to its ready endpoints (a standby aggregator does not listen). Cut drops
// every connection and refuses new ones until Restore: a node cut off from the API.
type Proxy struct {
	Addr     string
	backends []string
	l        net.Listener

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool
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
	go func() { io.Copy(up, c); done <- struct{}{} }()
	go func() { io.Copy(c, up); done <- struct{}{} }()
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
