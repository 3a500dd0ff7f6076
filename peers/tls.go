package peers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/imagepin/imagepin/internal/nodecert"
	"github.com/imagepin/imagepin/internal/reload"
)

func pool(file, what string) (*x509.CertPool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s %s: no PEM certificate", what, file)
	}
	return p, nil
}

// newCAFile is the CA bundle in file, read again when the file changes (package reload),
// so a rotated CA is taken at the next handshake as rotated certificates are; a bundle
// that no longer reads or holds no certificate keeps the last good one.
func newCAFile(file, what string) (*reload.Files[*x509.CertPool], error) {
	c := reload.New(func() (*x509.CertPool, error) { return pool(file, what) }, file)
	if _, err := c.Get(); err != nil {
		return nil, err
	}
	return c, nil
}

// ServerTLS is the peers' listener: its certificate (certFile, its key in keyFile, or
// in certFile when keyFile is "": nodecert.KeyPair) and the CA of the nodes' client
// certificates (the cluster's kubelet client CA). The files are read again when they
// change: each handshake uses the certificate and the CA bundle they hold then.
func ServerTLS(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	clients, err := newCAFile(clientCAFile, "peers.client_ca")
	if err != nil {
		return nil, err
	}
	load := nodecert.KeyPair(certFile, keyFile)
	if _, err := load(); err != nil {
		return nil, fmt.Errorf("peers.cert %s: %w", certFile, err)
	}
	base := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// HTTP/2: a peer's requests share one connection (see Client).
		NextProtos:     []string{"h2", "http/1.1"},
		ClientAuth:     tls.RequireAndVerifyClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return load() },
	}
	base.ClientCAs, _ = clients.Get()
	cfg := base.Clone()
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool, err := clients.Get()
		if err != nil {
			return nil, err
		}
		c := base.Clone()
		c.ClientCAs = pool
		return c, nil
	}
	return cfg, nil
}

// A peer's TCP connection is made within dialWithin; each time in a row it is not, the
// next one to that peer gets twice as long, up to slowBoundsMax times (48 s). Its TLS
// handshake, once under way, is given handshakeWithin: the request that wanted the
// connection stops waiting for it much sooner (stallAfter: the peer is slow, errSlow,
// and asked again), but the handshake goes on, and the connection it makes serves the
// next request. A handshake is CPU at both ends: one given up on is that CPU lost, and
// one more to make for two nodes short of CPU already. At 500 nodes sharing two cores,
// handshakes bounded to 5 s (doubling to 80 s) took 6 to 9 s on average, and more than
// half of all connections were given up on and made again.
var (
	dialWithin      = 3 * time.Second
	handshakeWithin = time.Minute
)

const slowBoundsMax = 4 // doublings

// peerSessions bounds the TLS sessions a node keeps to resume (one a peer, the peers it
// talked to last): a few kilobytes each.
const peerSessions = 128

// connBounds are the bounds of the next connection to each peer.
type connBounds struct {
	mu   sync.Mutex
	late map[string]int // connections in a row not made in time, by address
}

// scale is how many times its bases the next connection to addr gets.
func (b *connBounds) scale(addr string) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return time.Duration(1) << min(b.late[addr], slowBoundsMax)
}

// made notes a connection to addr made in time (ok), or not.
func (b *connBounds) made(addr string, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ok {
		delete(b.late, addr)
	} else {
		b.late[addr]++
	}
}

// Client is the HTTPS client to peers: it presents clientCertFile (the node's client
// certificate; its key in clientKeyFile, or in clientCertFile when that is "") and
// trusts peers whose serving certificates caFile signed. The files are read again when
// they change: each connection verifies the peer against the CA bundle the file holds
// then.
//
// It speaks HTTP/2 (HTTP/1.1 to a peer that does not): every request to a peer shares
// one connection, however many blobs a node asks it for at once. Over HTTP/1.1 each
// request in flight held a connection of its own, and a node following dozens of blobs
// down their trees held hundreds of connections (and its peers as many), opened and
// closed again as requests came and went.
//
// The Transport's DialContext makes the TCP connection under TLS (a test or bench may
// wrap it to bound a node's link).
func Client(clientCertFile, clientKeyFile, caFile string) (*http.Client, error) {
	roots, err := newCAFile(caFile, "peers.ca")
	if err != nil {
		return nil, err
	}
	load := nodecert.KeyPair(clientCertFile, clientKeyFile)
	if _, err := load(); err != nil {
		return nil, fmt.Errorf("peers.client_cert %s: %w", clientCertFile, err)
	}
	// The dial's bound is the context's (connBounds).
	dialer := &net.Dialer{KeepAlive: 30 * time.Second}
	bounds := &connBounds{late: map[string]int{}}
	// Connections to a peer after the first resume its TLS session (the peer's ticket):
	// neither side signs nor verifies a certificate again, which is most of a
	// handshake's CPU. The peer still checks, on each resumption, that the client
	// certificate it verified is unexpired and its CA still trusted.
	sessions := tls.NewLRUClientSessionCache(peerSessions)
	tr := &http.Transport{
		DialContext:       dialer.DialContext,
		ForceAttemptHTTP2: true,
		// A peer that takes a request and sends nothing is left after stallAfter
		// (Source.get: a 102 Processing counts, and a peer sends one every
		// progressEvery while it works on its answer); one that keeps saying so, after
		// answerWithin.
		ResponseHeaderTimeout: answerWithin,
		MaxIdleConnsPerHost:   4,
		// One connection to a peer is made at a time: every request waiting for it
		// shares it once it is up (HTTP/2). Without the bound each request in flight to
		// a peer with no connection yet dialed and shook hands on its own: at N = 200,
		// every node asking the head of a manifest's order for its images at once made
		// thousands of handshakes at once on that one node, which timed out.
		MaxConnsPerHost: 1,
		IdleConnTimeout: 90 * time.Second,
		HTTP2: &http.HTTP2Config{
			// A peer that stops answering on a connection every request to it shares:
			// pinged after 15 s of silence, dropped 15 s later.
			SendPingTimeout: stallAfter,
			PingTimeout:     stallAfter,
		},
	}
	// The TLS dial is ours so that each connection takes the CA bundle of the moment.
	tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		pool, err := roots.Get()
		if err != nil {
			return nil, err
		}
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		k := bounds.scale(addr)
		dctx, cancelDial := context.WithTimeout(ctx, k*dialWithin)
		raw, err := tr.DialContext(dctx, network, addr)
		cancelDial()
		if err != nil {
			if ctx.Err() == nil && dctx.Err() != nil {
				bounds.made(addr, false)
			}
			return nil, err
		}
		bounds.made(addr, true)
		conn := tls.Client(raw, &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: host,
			NextProtos:           []string{"h2", "http/1.1"},
			ClientSessionCache:   sessions,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return load() }})
		hctx, cancel := context.WithTimeout(ctx, handshakeWithin)
		defer cancel()
		if err := conn.HandshakeContext(hctx); err != nil {
			raw.Close()
			return nil, err
		}
		return conn, nil
	}
	return &http.Client{Transport: tr}, nil
}
