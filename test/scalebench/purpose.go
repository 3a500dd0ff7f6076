package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/imagepin/imagepin/peers"
)

// What each request to a peer was for, and what it cost in connections: the held
// summaries (peers.HeldPath), manifests, blobs. A connection is counted for the request
// that made the node dial it (the others to that peer share it, HTTP/2).

// purposeKey carries a request's purpose to the dial it makes (the Transport dials with
// the request's context values).
type purposeKey struct{}

// purposeOf is what a request to a peer is for, by its path.
func purposeOf(path string) string {
	switch {
	case path == peers.HeldPath:
		return "held"
	case strings.Contains(path, "/manifests/"):
		return "manifest"
	case strings.Contains(path, "/blobs/"):
		return "blob"
	}
	return "other"
}

// purposeCount is what the requests of one purpose cost.
type purposeCount struct {
	Requests   int64 // requests sent (each try)
	Failed     int64 // requests that got no answer (no connection, timed out, cut)
	Dials      int64 // TCP connections dialled
	Handshakes int64 // TLS handshakes done
	HandFailed int64 // dials or handshakes that failed
	HandNanos  int64 // time in handshakes done, in all
}

// purposes counts by purpose.
type purposes struct {
	mu sync.Mutex
	by map[string]*purposeCount
}

func (p *purposes) add(purpose string, f func(*purposeCount)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.by == nil {
		p.by = map[string]*purposeCount{}
	}
	c := p.by[purpose]
	if c == nil {
		c = &purposeCount{}
		p.by[purpose] = c
	}
	f(c)
}

func (p *purposes) snapshot() map[string]purposeCount {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]purposeCount{}
	for k, v := range p.by {
		out[k] = *v
	}
	return out
}

func ctxPurpose(ctx context.Context) string {
	if s, ok := ctx.Value(purposeKey{}).(string); ok {
		return s
	}
	return "other"
}

// countPurposes makes c's requests, and the connections and handshakes they make,
// counted in p by purpose (after paceClient: its dial is the one counted).
func countPurposes(c *http.Client, p *purposes) {
	tr := c.Transport.(*http.Transport)
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		p.add(ctxPurpose(ctx), func(c *purposeCount) { c.Dials++ })
		return dial(ctx, network, addr)
	}
	dialTLS := tr.DialTLSContext
	tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		start := time.Now()
		conn, err := dialTLS(ctx, network, addr)
		took := time.Since(start)
		p.add(ctxPurpose(ctx), func(c *purposeCount) {
			if err != nil {
				c.HandFailed++
			} else {
				c.Handshakes++
				c.HandNanos += int64(took)
			}
		})
		return conn, err
	}
	c.Transport = purposeTripper{tr, p}
}

// purposeTripper tags each request with its purpose and counts it.
type purposeTripper struct {
	tr *http.Transport
	p  *purposes
}

func (t purposeTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	purpose := purposeOf(r.URL.Path)
	r = r.WithContext(context.WithValue(r.Context(), purposeKey{}, purpose))
	resp, err := t.tr.RoundTrip(r)
	t.p.add(purpose, func(c *purposeCount) {
		c.Requests++
		if err != nil {
			c.Failed++
		}
	})
	return resp, err
}

func (t purposeTripper) CloseIdleConnections() { t.tr.CloseIdleConnections() }

// purposeString is the counts by purpose, in a line.
func purposeString(by map[string]purposeCount) string {
	var keys []string
	for k := range by {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		c := by[k]
		mean := time.Duration(0)
		if c.Handshakes > 0 {
			mean = time.Duration(c.HandNanos / c.Handshakes)
		}
		parts = append(parts, fmt.Sprintf("%s: %d requests (%d failed), %d dials, %d handshakes (mean %s), %d dials or handshakes failed",
			k, c.Requests, c.Failed, c.Dials, c.Handshakes, mean.Round(time.Millisecond), c.HandFailed))
	}
	return strings.Join(parts, "; ")
}
