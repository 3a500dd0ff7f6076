package main

import (
	"context"
	"errors"
	"net"
	"sync"
)

// pipeListener is a node's local mirror reached in memory: each dial is a net.Pipe,
// its far end accepted here. A real node's runtime reaches its mirror over loopback
// in its own process and file table; N nodes in one process would hold two
// descriptors for each of their runtimes' connections in one table (thousands at
// N = 200), which no node has, so the simulated runtime↔mirror side uses none.
type pipeListener struct {
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

var errPipeClosed = errors.New("pipe listener closed")

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, errPipeClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

// dial is the runtime's end of a new connection.
func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		client.Close()
		server.Close()
		return nil, errPipeClosed
	case <-ctx.Done():
		client.Close()
		server.Close()
		return nil, ctx.Err()
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "mirror" }
