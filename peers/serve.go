package peers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/time/rate"

	"github.com/imagepin/imagepin/internal/nodecert"
)

// Server serves the mirror to other nodes: only to clients presenting a node's
// certificate, at most MaxServing blob requests at once, and as many manifest requests
// (more get 503: the client asks the next node; a request waits up to slotWait for its
// turn), at most BytesPerSecond in all (0: no limit). Manifests have slots of their
// own: a blob request may wait on a manifest from a peer (the chain above the blob),
// and that peer's blob slots may all be taken by requests waiting on this node.
type Server struct {
	Mirror         http.Handler // the mirror's handler for peers (chained, filling from the registry)
	MaxServing     int
	BytesPerSecond int64
	Stats          *Stats
	Log            logrus.FieldLogger

	once                 sync.Once
	slots, manifestSlots chan struct{}
	limiter              *rate.Limiter
}

// slotWait is how long a request waits for one of the MaxServing slots: short, as a
// node asking for a blob goes on to the next node above it in the blob's tree at a 503
// (Source.Blob), and one asking for a manifest asks again after pinPoll.
var slotWait = time.Second

// burst is how many bytes one write may send at once under the rate limit.
const burst = 256 << 10

// init makes the slots and the limiter, once: at Serve, or at the first request when
// the Server is used as a handler of another http.Server.
func (s *Server) init() {
	s.once.Do(func() {
		s.slots = make(chan struct{}, max(s.MaxServing, 1))
		s.manifestSlots = make(chan struct{}, max(s.MaxServing, 1))
		if s.BytesPerSecond > 0 {
			s.limiter = rate.NewLimiter(rate.Limit(s.BytesPerSecond), burst)
		}
	})
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.init()
	if r.TLS == nil {
		http.Error(w, "peers talk HTTPS", http.StatusForbidden)
		return
	}
	if _, err := nodecert.Name(r.TLS.VerifiedChains); err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	// A request waits its turn for a while (a pre-load asks for many blobs at once);
	// then the client asks the next node.
	slots := s.slots
	if strings.Contains(r.URL.Path, "/manifests/") {
		slots = s.manifestSlots
	}
	wait := time.NewTimer(slotWait)
	defer wait.Stop()
	select {
	case slots <- struct{}{}:
		defer func() { <-slots }()
	case <-wait.C:
		w.Header().Set("Retry-After", "1")
		http.Error(w, "serving as many peers as allowed", http.StatusServiceUnavailable)
		return
	case <-r.Context().Done():
		return
	}
	s.Mirror.ServeHTTP(&limitedWriter{ResponseWriter: w, ctx: r.Context(), limiter: s.limiter, stats: s.Stats}, r)
}

// limitedWriter counts what goes to peers and paces it.
type limitedWriter struct {
	http.ResponseWriter
	ctx     context.Context
	limiter *rate.Limiter
	stats   *Stats
}

// Unwrap lets http.ResponseController reach the connection's writer (Flush).
func (l *limitedWriter) Unwrap() http.ResponseWriter { return l.ResponseWriter }

func (l *limitedWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), burst)]
		if l.limiter != nil {
			if err := l.limiter.WaitN(l.ctx, len(chunk)); err != nil {
				return written, err
			}
		}
		n, err := l.ResponseWriter.Write(chunk)
		written += n
		l.stats.ToPeers.Add(int64(n))
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

// Serve listens on address with tlsConfig and serves until ctx ends.
func (s *Server) Serve(ctx context.Context, address string, tlsConfig *tls.Config) error {
	s.init()
	l, err := net.Listen("tcp", address)
	if err != nil {
		return fmt.Errorf("peers: %w", err)
	}
	srv := &http.Server{Handler: s, TLSConfig: tlsConfig, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.ServeTLS(l, "", ""); err != nil && err != http.ErrServerClosed {
		return err
	}
	return nil
}

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

// caFile is a CA bundle read again when the file changes (its size or modification
// time), so a rotated CA is taken at the next handshake as rotated certificates are. A
// bundle that no longer reads or holds no certificate keeps the last good one.
type caFile struct {
	file, what string

	mu      sync.Mutex
	size    int64
	modTime time.Time
	pool    *x509.CertPool
}

func newCAFile(file, what string) (*caFile, error) {
	c := &caFile{file: file, what: what}
	if _, err := c.get(); err != nil {
		return nil, err
	}
	return c, nil
}

// get is the bundle as the file holds it now.
func (c *caFile) get() (*x509.CertPool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fi, err := os.Stat(c.file)
	if err == nil && c.pool != nil && fi.Size() == c.size && fi.ModTime().Equal(c.modTime) {
		return c.pool, nil
	}
	p, perr := pool(c.file, c.what)
	switch {
	case perr == nil && err == nil:
		c.pool, c.size, c.modTime = p, fi.Size(), fi.ModTime()
	case c.pool == nil:
		if perr == nil {
			perr = err
		}
		return nil, perr
	}
	return c.pool, nil
}

// keyPair loads a certificate and its key from one PEM file (as the kubelet keeps
// kubelet-server-current.pem and kubelet-client-current.pem), again at each use: a
// rotated certificate is picked up.
func keyPair(file string) func() (*tls.Certificate, error) {
	return func() (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(file, file)
		return &c, err
	}
}

// ServerTLS is the peers' listener: certFile (certificate and key, one PEM) and the
// CA of the nodes' client certificates (the cluster's kubelet client CA). Both files are
// read again when they change: each handshake uses the CA bundle the file holds then.
func ServerTLS(certFile, clientCAFile string) (*tls.Config, error) {
	clients, err := newCAFile(clientCAFile, "peers.client_ca")
	if err != nil {
		return nil, err
	}
	load := keyPair(certFile)
	if _, err := load(); err != nil {
		return nil, fmt.Errorf("peers.cert %s: %w", certFile, err)
	}
	base := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		ClientAuth:     tls.RequireAndVerifyClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return load() },
	}
	base.ClientCAs, _ = clients.get()
	cfg := base.Clone()
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool, err := clients.get()
		if err != nil {
			return nil, err
		}
		c := base.Clone()
		c.ClientCAs = pool
		return c, nil
	}
	return cfg, nil
}

// Client is the HTTPS client to peers: it presents clientCertFile (the node's client
// certificate and key, one PEM) and trusts peers whose serving certificates caFile
// signed. Both files are read again when they change: each connection verifies the peer
// against the CA bundle the file holds then.
func Client(clientCertFile, caFile string) (*http.Client, error) {
	roots, err := newCAFile(caFile, "peers.ca")
	if err != nil {
		return nil, err
	}
	load := keyPair(clientCertFile)
	if _, err := load(); err != nil {
		return nil, fmt.Errorf("peers.client_cert %s: %w", clientCertFile, err)
	}
	dialer := &net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		// The TLS dial is ours so that each connection takes the CA bundle of the moment.
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			pool, err := roots.get()
			if err != nil {
				return nil, err
			}
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			raw, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			conn := tls.Client(raw, &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: host,
				GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return load() }})
			hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := conn.HandshakeContext(hctx); err != nil {
				raw.Close()
				return nil, err
			}
			return conn, nil
		},
		ResponseHeaderTimeout: 60 * time.Second,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
	}
	return &http.Client{Transport: tr}, nil
}
