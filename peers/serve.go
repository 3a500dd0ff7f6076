package peers

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/time/rate"

	"github.com/imagepin/imagepin/internal/nodecert"
)

// Server serves the mirror to other nodes: only to clients presenting a node's
// certificate, at most MaxServing blobs at once, and as many manifests (more get 503:
// the client asks the next node; a request waits up to slotWait for its turn), at most
// BytesPerSecond in all (0: no limit).
//
// A blob's requests share one slot: down a blob's tree a node serves each blob it
// passes on to its children (Source.Fanout of them) while it arrives, all reading the
// node's one fill of it, and a request joining a blob already served costs a reader of
// that fill, not another transfer. A slot a request made each node serve about as
// many requests as the blobs in flight times the fanout, and a node pulling more blobs
// at once than max_serving divided by the fanout turned its children away: they climbed
// onto the nodes above, whose slots filled in turn. Requests sharing a slot are bounded
// too: at most joinedPerSlot times MaxServing blob requests at once.
//
// Manifests have slots of their own, shared the same way by the requests for one
// manifest: a blob request may wait on a manifest from a peer (the chain above the
// blob), and that peer's blob slots may all be taken by requests waiting on this node.
// A slot a manifest request had the head of a manifest's order (which every node asks)
// serve max_serving of them while it fetched the manifest, and turn the rest away (503)
// to ask again every pinPoll: at 500 nodes, peers busy for a whole minute, set aside.
type Server struct {
	Mirror http.Handler // the mirror's handler for peers (chained, filling from the registry)
	// SeedsDir holds the node's seed records: what they name is the node's answer at
	// HeldPath ("": it holds no seed), with what Held says the store holds of the
	// images the node pins (nil: nothing more).
	SeedsDir       string
	Held           HeldFunc
	MaxServing     int
	BytesPerSecond int64
	Stats          *Stats
	Log            logrus.FieldLogger

	once                 sync.Once
	slots, manifestSlots chan struct{}
	limiter              *rate.Limiter
	held                 *heldServer

	mu      sync.Mutex
	serving map[string]*slot // by kind and digest ("blobs/sha256:…")
	// blobs and manifests count the requests being served, or waiting for their slot
	// (under mu).
	blobs, manifests int
}

// slot is one blob or manifest being served, shared by its requests.
type slot struct {
	refs  int           // requests holding or waiting for it (under Server.mu)
	ready chan struct{} // closed once the slot is taken (ok) or not
	ok    bool
}

// joinedPerSlot bounds the blob requests served at once: MaxServing times this. A
// node's children (the fanout) and the nodes climbing past a dead or busy node share
// a blob's slot; a star (every node asking the head) needs more.
const joinedPerSlot = 8

// joinedPerManifestSlot bounds the manifest requests served at once: MaxServing times
// this. Every node asks the head of a manifest's order for it (a manifest is small),
// so one manifest's slot is shared by about as many requests as there are nodes.
const joinedPerManifestSlot = 32

// slotWait is how long a request waits for one of the MaxServing slots: short, as a
// node asking for a blob goes on to the next node above it in the blob's tree at a 503
// (Source.Blob), and one asking for a manifest asks again after pinPoll.
var slotWait = time.Second

// burst is how many bytes one write may send at once under the rate limit.
const burst = 256 << 10

// PaceChunk is how many bytes one write (or read) paced at bytesPerSecond moves at once:
// a twentieth of a second's worth, from 4 KiB to burst. Each answer under way waits for
// its piece's tokens in turn, so a small answer (a manifest, a held summary) waits
// behind one piece of each answer under way. At the rates serve_mib_per_second allows (1
// MiB/s and up) a piece is 52 KB or more, above the 32 KiB a write of the mirror
// carries, so the pieces are the writes; below it (the scale bench's scaled-down
// links) the wait stays about max_serving times 50 ms.
func PaceChunk(bytesPerSecond int64) int {
	return int(min(max(bytesPerSecond/20, 4<<10), burst))
}

// init makes the slots and the limiter, once: at Serve, or at the first request when
// the Server is used as a handler of another http.Server.
func (s *Server) init() {
	s.once.Do(func() {
		s.slots = make(chan struct{}, max(s.MaxServing, 1))
		s.manifestSlots = make(chan struct{}, max(s.MaxServing, 1))
		s.serving = map[string]*slot{}
		s.held = &heldServer{dir: s.SeedsDir, pinned: s.Held}
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
	if r.URL.Path == HeldPath {
		s.held.ServeHTTP(w, r)
		return
	}
	// Until the answer, the client is told every progressEvery that the request is
	// being worked on (it may wait on this node's own sources: its parent, a busy peer,
	// the registry), so that it leaves only a node that hangs (Source.get).
	a := newAnswering(w)
	defer a.finish()
	w = a
	// A request waits its turn for a while (a pre-load asks for many blobs at once);
	// then the client asks the next node.
	var release func()
	if strings.Contains(r.URL.Path, "/manifests/") {
		release = s.takeShared(r.Context(), s.manifestSlots, joinedPerManifestSlot, &s.manifests, "manifests/"+path.Base(r.URL.Path))
	} else {
		release = s.takeShared(r.Context(), s.slots, joinedPerSlot, &s.blobs, "blobs/"+path.Base(r.URL.Path))
	}
	if release == nil {
		if r.Context().Err() == nil {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "serving as many peers as allowed", http.StatusServiceUnavailable)
		}
		return
	}
	defer release()
	s.Mirror.ServeHTTP(&limitedWriter{ResponseWriter: w, ctx: r.Context(), limiter: s.limiter, chunk: PaceChunk(s.BytesPerSecond), stats: s.Stats}, r)
}

// takeShared is the slot of key (a kind and a digest) among slots: joined when key is
// being served already, else one of slots, waited for up to slotWait; nil when none
// came or joined times as many requests as slots (counted in n) are being served.
func (s *Server) takeShared(ctx context.Context, slots chan struct{}, joined int, n *int, key string) (release func()) {
	s.mu.Lock()
	if *n >= joined*cap(slots) {
		s.mu.Unlock()
		return nil
	}
	*n++
	sl := s.serving[key]
	first := sl == nil
	if first {
		sl = &slot{ready: make(chan struct{})}
		s.serving[key] = sl
	}
	sl.refs++
	s.mu.Unlock()
	drop := func() {
		s.mu.Lock()
		*n--
		if sl.refs--; sl.refs == 0 {
			if s.serving[key] == sl {
				delete(s.serving, key)
			}
			if sl.ok {
				<-slots
			}
		}
		s.mu.Unlock()
	}
	if first {
		wait := time.NewTimer(slotWait)
		select {
		case slots <- struct{}{}:
			sl.ok = true
		case <-wait.C:
		case <-ctx.Done():
		}
		wait.Stop()
		if !sl.ok {
			// The requests that joined it get a 503 too; the next starts afresh.
			s.mu.Lock()
			if s.serving[key] == sl {
				delete(s.serving, key)
			}
			s.mu.Unlock()
		}
		close(sl.ready)
	} else {
		select {
		case <-sl.ready:
		case <-ctx.Done():
			drop()
			return nil
		}
	}
	if !sl.ok {
		drop()
		return nil
	}
	return drop
}

// answerWithin bounds the wait for a peer's answer (its response headers), however
// long it says it works on it (102 Processing).
const answerWithin = 60 * time.Second

// progressEvery is how often a node tells a peer waiting for its answer that it works on
// it: well within the peer's stall bound.
func progressEvery() time.Duration { return stallAfter / 3 }

// answering is a response that sends 102 Processing every progressEvery until the
// handler answers: the client tells a node waiting on its own sources from one that
// took the request and hung. The handler's headers are its own until it answers (a
// 1xx sends the response's header map, which the handler may be writing).
//
// On HTTP/2 a 1xx's header frame is encoded on the connection's writer, which may still
// read the response's header map after WriteHeader returned (early, when the client
// reset the stream): the answer must not write into that map then. net/http sends a
// 1xx from a copy of the map when it holds a Content-Length (which no 1xx carries): the
// response's map holds one (holdCopy) from the start until the answer, so no 102 is
// ever sent from the map the answer writes.
type answering struct {
	w      http.ResponseWriter
	header http.Header

	mu       sync.Mutex
	answered bool
	timer    *time.Timer
}

// holdCopy is the Content-Length the response's header map holds until the answer,
// so that every 102 is sent from a copy of it (answering).
const holdCopy = "0"

func newAnswering(w http.ResponseWriter) *answering {
	a := &answering{w: w, header: http.Header{}}
	w.Header()["Content-Length"] = []string{holdCopy}
	a.mu.Lock()
	a.timer = time.AfterFunc(progressEvery(), a.progress)
	a.mu.Unlock()
	return a
}

func (a *answering) progress() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.answered {
		return
	}
	a.w.WriteHeader(http.StatusProcessing)
	a.timer.Reset(progressEvery())
}

// answer sends the handler's headers with code, once (under mu).
func (a *answering) answer(code int) {
	if a.answered {
		return
	}
	a.answered = true
	a.timer.Stop()
	h := a.w.Header()
	delete(h, "Content-Length") // holdCopy, unless the handler set one (below)
	for k, v := range a.header {
		h[k] = v
	}
	a.w.WriteHeader(code)
}

func (a *answering) Header() http.Header { return a.header }

func (a *answering) WriteHeader(code int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.answer(code)
}

func (a *answering) Write(p []byte) (int, error) {
	a.mu.Lock()
	a.answer(http.StatusOK)
	a.mu.Unlock()
	return a.w.Write(p)
}

// FlushError answers (200) if the handler has not, then flushes.
func (a *answering) FlushError() error {
	a.mu.Lock()
	a.answer(http.StatusOK)
	a.mu.Unlock()
	return http.NewResponseController(a.w).Flush()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (a *answering) Unwrap() http.ResponseWriter { return a.w }

// finish ends the progress; a handler that wrote nothing answers 200, as net/http
// does, with its headers.
func (a *answering) finish() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.answer(http.StatusOK)
}

// limitedWriter counts what goes to peers and paces it.
type limitedWriter struct {
	http.ResponseWriter
	ctx     context.Context
	limiter *rate.Limiter
	chunk   int // bytes paced at once (PaceChunk)
	stats   *Stats
}

// Unwrap lets http.ResponseController reach the connection's writer (Flush).
func (l *limitedWriter) Unwrap() http.ResponseWriter { return l.ResponseWriter }

func (l *limitedWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), l.chunk)]
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
	// ReadHeaderTimeout bounds the TLS handshake too (and, peers speaking HTTP/2, only
	// it): as long as the asker gives it (handshakeWithin), or the server would give up
	// on a handshake the asker still waits for, its CPU lost at both ends.
	srv := &http.Server{Handler: s, TLSConfig: tlsConfig, ReadHeaderTimeout: handshakeWithin,
		// A peer's requests share one connection (Client): as many at once as the
		// serving bound lets wait (Server).
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: 1000}}
	s.serverConnEvents(srv)
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
