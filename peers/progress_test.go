package peers

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"
)

// h2Writer is a response writer that sends a 1xx as HTTP/2 does (net/http's h2 server):
// from a copy of the response's header map when it holds a Content-Length or a
// Transfer-Encoding, else from the map itself, read on the connection's writer after
// WriteHeader returned (it returns early when the client reset the stream). live
// counts the 1xx sent from the map itself; each is read again at the end (encode).
type h2Writer struct {
	h      http.Header
	status int
	body   bytes.Buffer

	mu      sync.Mutex
	live    int
	pending []http.Header // the maps the writer still reads
}

func (w *h2Writer) Header() http.Header { return w.h }

func (w *h2Writer) WriteHeader(code int) {
	if code >= 100 && code <= 199 {
		h := w.h
		_, cl := h["Content-Length"]
		_, te := h["Transfer-Encoding"]
		if cl || te {
			h = h.Clone()
			h.Del("Content-Length")
			h.Del("Transfer-Encoding")
		}
		w.mu.Lock()
		if !cl && !te {
			w.live++
		}
		w.pending = append(w.pending, h)
		w.mu.Unlock()
		return
	}
	if w.status == 0 {
		w.status = code
	}
}

func (w *h2Writer) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(p)
}

// encode reads every map a 1xx was sent from, as the connection's writer does: a map
// changed since the 1xx (the answer written into it) is what it would read.
func (w *h2Writer) encode() (keys []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, h := range w.pending {
		for k := range h {
			keys = append(keys, k)
		}
	}
	return keys
}

// The answer never writes into a header map a 102 was sent from: on HTTP/2 the
// connection's writer may still read it (a client resetting the stream as the 102
// goes), and a map read while written is fatal. Every 102 is sent from a copy; the
// answer carries the handler's headers and no Content-Length it did not set.
func TestAnswerNeverWritesTheMapA102WasSentFrom(t *testing.T) {
	old := stallAfter
	stallAfter = 60 * time.Millisecond
	t.Cleanup(func() { stallAfter = old })
	for _, cl := range []string{"", "5"} {
		w := &h2Writer{h: http.Header{}}
		a := newAnswering(w)
		a.Header().Set("X-Test", "1")
		time.Sleep(4 * progressEvery())
		if cl != "" {
			a.Header().Set("Content-Length", cl)
		}
		a.WriteHeader(http.StatusOK)
		io.WriteString(a, "hello")
		a.finish()
		keys := w.encode()
		w.mu.Lock()
		sent, live := len(w.pending), w.live
		w.mu.Unlock()
		if sent == 0 {
			t.Fatal("no 102 sent")
		}
		if live > 0 {
			t.Fatalf("%d of %d 102s were sent from the response's own header map, which the answer then writes", live, sent)
		}
		if len(keys) > 0 {
			t.Fatalf("a 102 carried %v", keys)
		}
		if w.status != http.StatusOK || w.h.Get("X-Test") != "1" || w.h.Get("Content-Length") != cl || w.body.String() != "hello" {
			t.Fatalf("the answer: %d, headers %v, body %q; want 200, X-Test, Content-Length %q", w.status, w.h, w.body.String(), cl)
		}
	}
}

// Over HTTP/1.1 and HTTP/2 alike, a peer's many 102s come before the answer, carrying
// none of the handler's headers; the answer carries them, and no Content-Length the
// handler did not set (its body whole, chunked or not); a client resetting the stream
// while the 102s go ends nothing but its request (run with -race).
func TestMany102sThenTheAnswer(t *testing.T) {
	old := stallAfter
	stallAfter = 90 * time.Millisecond
	t.Cleanup(func() { stallAfter = old })
	var handlers sync.WaitGroup // the handlers end before stallAfter is put back
	t.Cleanup(handlers.Wait)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handlers.Add(1)
		defer handlers.Done()
		a := newAnswering(w)
		defer a.finish()
		w = a
		w.Header().Set("X-Test", "1")
		select {
		case <-time.After(8 * progressEvery()):
		case <-r.Context().Done():
			return
		}
		if r.URL.Query().Get("cl") != "" {
			w.Header().Set("Content-Length", "5")
		}
		w.Header().Set("X-After", "1")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "hello")
	})
	for _, h2 := range []bool{false, true} {
		srv := httptest.NewUnstartedServer(h)
		srv.EnableHTTP2 = h2
		srv.StartTLS()
		for _, q := range []string{"", "?cl=1"} {
			var n atomic.Int32
			ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
				if len(h) > 0 {
					t.Errorf("a 102 carried %v", h)
				}
				n.Add(1)
				return nil
			}})
			req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/"+q, nil)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatalf("h2=%v %s: %v", h2, q, err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || string(b) != "hello" || resp.Header.Get("X-Test") != "1" || resp.Header.Get("X-After") != "1" || n.Load() < 4 {
				t.Fatalf("h2=%v %s (%s): %d 102s, status %d, body %q, %v, headers %v", h2, q, resp.Proto, n.Load(), resp.StatusCode, b, err, resp.Header)
			}
			if resp.ContentLength != -1 && resp.ContentLength != 5 {
				t.Fatalf("h2=%v %s: Content-Length %d", h2, q, resp.ContentLength)
			}
		}
		// Clients leaving while the 102s go (the stream reset on HTTP/2).
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithCancel(context.Background())
				trace := &httptrace.ClientTrace{Got1xxResponse: func(int, textproto.MIMEHeader) error {
					if i%2 == 0 {
						cancel()
					}
					return nil
				}}
				time.AfterFunc(time.Duration(i)*progressEvery()/2+progressEvery(), cancel)
				req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), "GET", srv.URL, nil)
				if resp, err := srv.Client().Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
		wg.Wait()
		srv.Close()
	}
}

// lateTransport answers a request only once its context ended (the stall bound
// fired), after a 102 (the trace's Got1xxResponse), with a 200 whose body, as
// net/http's, fails once the request's context has ended.
type lateTransport struct{}

func (lateTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	<-req.Context().Done()
	if tr := httptrace.ContextClientTrace(req.Context()); tr != nil && tr.Got1xxResponse != nil {
		tr.Got1xxResponse(http.StatusProcessing, nil)
	}
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, ContentLength: 5, Request: req,
		Body: &ctxBody{ctx: req.Context(), r: strings.NewReader("hello")}}, nil
}

type ctxBody struct {
	ctx context.Context
	r   io.Reader
}

func (b *ctxBody) Read(p []byte) (int, error) {
	if err := b.ctx.Err(); err != nil {
		return 0, err
	}
	return b.r.Read(p)
}
func (b *ctxBody) Close() error { return nil }

// A 102 that comes just after the stall bound fired, and the answer with it, do not
// bring the request back: the peer is left as one sending nothing (errSilent), not
// taken with a body already cut ("context canceled").
func TestA102AfterTheStallBoundFiredBringsNothingBack(t *testing.T) {
	old := stallAfter
	stallAfter = 50 * time.Millisecond
	t.Cleanup(func() { stallAfter = old })
	s := NewSource("", func() []string { return nil }, nil, &http.Client{Transport: lateTransport{}}, &Stats{}, logrus.New())
	d := digest.FromString("x")
	resp, err := s.get(context.Background(), "peer.example:1", repo, "blobs", nil, d, 0, false, false)
	if err == nil {
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("a request the stall bound ended came back: %d, body %q, %v", resp.StatusCode, b, rerr)
	}
	if !errors.Is(err, errSilent) {
		t.Fatalf("err %v, want the peer sending nothing", err)
	}
}

// A manifest under a sha512 digest is checked with sha512: a peer sending it right is
// read, not set aside for sending wrong bytes.
func TestAPeersSha512ManifestIsCheckedWithSha512(t *testing.T) {
	reg := newRegistry(t, 1, 1<<10)
	d := digest.SHA512.FromBytes(reg.manifest)
	peer := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/manifests/"+d.String()) {
			http.NotFound(w, r)
			return
		}
		w.Write(reg.manifest)
	}))
	t.Cleanup(peer.Close)
	node := strings.TrimPrefix(peer.URL, "https://")
	reg.down.Store(true)
	s := NewSource("", func() []string { return []string{node} }, reg, peer.Client(), &Stats{}, logrus.New())
	s.held = nil
	data, _, err := s.Manifest(context.Background(), repo, nil, d, -1)
	if err != nil || !bytes.Equal(data, reg.manifest) {
		t.Fatalf("%d bytes, %v", len(data), err)
	}
	if s.isAside(node) {
		t.Fatal("a peer sending a sha512 manifest right was set aside")
	}
}
