package peers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/mirror"
)

// Source is the mirror's Source on a node with peers. A manifest comes from the nodes
// in its digest's rendezvous order, this node's turn being the registry. A blob comes
// down a tree laid over its digest's order (Fanout children a node): a node asks its
// parent, climbing to the parent's parent when one fails, the head's turn being the
// registry; see Blob.
type Source struct {
	// Self is this node's peer address ("": it serves no peers; the registry comes
	// after every peer).
	Self string
	// Nodes are the peers' addresses (Self among them or not), read at each request.
	Nodes func() []string
	// Registry is the node's own way to the registry (CountRegistry counts its bytes).
	Registry mirror.Source
	Client   *http.Client
	Stats    *Stats
	Log      logrus.FieldLogger
	// Fanout is how many children a node has in a blob's tree: the most copies of a
	// blob it uploads while every node is up (0: DefaultFanout). A fanout of at least
	// the number of nodes is a star: every node asks the head.
	Fanout int

	*health
}

// NewSource is a Source (see its fields).
func NewSource(self string, nodes func() []string, registry mirror.Source, client *http.Client, stats *Stats, log logrus.FieldLogger) *Source {
	return &Source{Self: self, Nodes: nodes, Registry: registry, Client: client, Stats: stats, Log: log,
		health: &health{bad: map[string]time.Time{}, refusing: map[string]*refusal{}, notPinning: map[[2]string]time.Time{},
			busyTimes: map[string]int{}, busyUntil: map[string]time.Time{}, held: newHoldings(client, log)}}
}

// asking is how a peer is asked.
type asking int

const (
	// waiting asks again while the peer does not pin the image yet (up to pinWait once
	// per peer and image) and while it is busy (up to busyWait, and no longer once it
	// is set aside): a manifest's order.
	waiting asking = iota
	// climbing asks again while the peer does not pin the image yet; a busy peer is
	// left at once (the next ancestor is asked): a blob's tree.
	climbing
	// holding asks a peer whose seeds hold the digest (HeldPath) for what it holds only
	// (mirror.StoredOnlyHeader), again while it does not pin the image yet or is busy,
	// as waiting does: it is the one node known to have it.
	holding
	// once asks once.
	once
	// storedOnly asks once for what the peer holds already (mirror.StoredOnlyHeader):
	// it answers at once, from its store, and asks nobody.
	storedOnly
)

// ask is get, asking again as how says (root: the pinned manifest the request leads
// to).
func (s *Source) ask(ctx context.Context, node, repo, kind string, chain []digest.Digest, d digest.Digest, from int64, how asking, hop bool) (*http.Response, error) {
	root := d
	if len(chain) > 0 {
		root = chain[len(chain)-1]
	}
	key := [2]string{node, root.String()}
	s.mu.Lock()
	skip := time.Now().Before(s.notPinning[key])
	s.mu.Unlock()
	if skip {
		return nil, errNotPinned
	}
	start := time.Now()
	var slowSince time.Time
	for {
		if wait := s.probed(node); wait > 0 && how < once {
			if !s.listed(node) {
				return nil, errUnlisted
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(wait):
			}
			continue
		}
		resp, err := s.get(ctx, node, repo, kind, chain, d, from, how == storedOnly || how == holding, hop)
		if how >= once {
			return resp, err
		}
		if s.starting(ctx, node, err) {
			if !s.listed(node) {
				// Gone from the peers (the aggregator no longer names it: a node taken
				// out): it is not starting, and waiting for it would hold this request
				// for the rest of startWait.
				return nil, fmt.Errorf("%w: %w", errUnlisted, err)
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(pinPoll):
			}
			continue
		}
		if errors.Is(err, errBusy) {
			since := start
			switch {
			case errors.Is(err, errSlow):
				// A slow peer is asked again, an ancestor too rather than climbed past
				// (the node above it would send one more copy, and the one below it
				// would head the blob were it the head): up to busyWait from its first
				// slow answer (an answer may take answerWithin).
				if slowSince.IsZero() {
					slowSince = time.Now()
				}
				since = slowSince
			case how == climbing:
				// A busy ancestor (503) is left for the next at once (plan).
				return nil, err
			}
			if time.Since(since) >= busyWait {
				// Busy for a whole window: every digest it heads would cost each asker
				// as much. Set aside, as a peer that fails.
				s.setAsideBusy(node)
				return nil, err
			}
			if s.isAside(node) {
				// Set aside meanwhile (another fetch found it busy for its whole
				// window): this one waits on it no longer.
				return nil, err
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(pinPoll):
			}
			continue
		}
		if !errors.Is(err, errNotPinned) {
			return resp, err
		}
		if time.Since(start) > pinWait {
			s.mu.Lock()
			s.notPinning[key] = time.Now().Add(notPinningFor)
			s.mu.Unlock()
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(pinPoll):
		}
	}
}

// self marks the registry's turn in an order.
const self = ""

// errUnlisted is a peer refusing connections that is no longer among the peers.
var errUnlisted = errors.New("refusing connections, and no longer among the peers")

// listed says whether node is among the peers now (Nodes).
func (s *Source) listed(node string) bool {
	return slices.Contains(s.Nodes(), node)
}

// order is who to ask for key: the nodes in rendezvous order (this node: the registry),
// then the registry if this node is not among them, then the nodes set aside.
func (s *Source) order(key digest.Digest) []string {
	nodes := slices.Clone(s.Nodes())
	if s.Self != "" && !slices.Contains(nodes, s.Self) {
		nodes = append(nodes, s.Self)
	}
	var good, aside []string
	now := time.Now()
	s.mu.Lock()
	for _, n := range Order(key, nodes) {
		switch {
		case n == s.Self:
			good = append(good, self)
		case now.Before(s.bad[n]):
			aside = append(aside, n)
		default:
			good = append(good, n)
		}
	}
	s.mu.Unlock()
	if !slices.Contains(good, self) {
		good = append(good, self)
	}
	return append(good, aside...)
}

// errSilent is a peer that took a request and sent nothing for stallAfter.
var errSilent = errors.New("the peer took the request and sends nothing")

// cancelOnClose ends a request's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

// hearing notes each byte read as heard from node (stillHearing).
type hearing struct {
	io.ReadCloser
	h    *health
	node string
}

func (r *hearing) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if n > 0 {
		r.h.hear(r.node)
	}
	return n, err
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel(nil)
	return err
}

// errNotThere is a peer's 404 (or 503: busy): ask the next, the peer is fine.
// errNotPinned is a 404 from a peer that does not pin the image (or not yet).
var (
	errNotThere  = errors.New("not there")
	errNotPinned = fmt.Errorf("does not pin it (yet): %w", errNotThere)
	errBusy      = fmt.Errorf("serving as many peers as it allows: %w", errNotThere)
	// errSlow is a peer whose connection, handshake or answer took longer than its
	// bound (dialWithin, handshakeWithin, answerWithin): a node whose own CPU is
	// starved, or a peer working hard, looks the same from here, and neither is bad.
	// It is busy: asked again (ask), set aside only when slow for a whole busyWait.
	errSlow = fmt.Errorf("slow to connect or answer: %w", errBusy)
)

// timedOut tells whether err, a request's failure while ctx goes on, is a bound timing
// out (the dial's, the handshake's, the answer's), not the peer refusing or failing.
func timedOut(ctx context.Context, err error) bool {
	var t interface{ Timeout() bool }
	return ctx.Err() == nil && !errors.Is(err, errSilent) && errors.As(err, &t) && t.Timeout()
}

// Peers pin the same sets but not at the same instant: a peer that does not pin an
// image yet is asked again every pinPoll for up to pinWait, then taken for one that
// does not pin it for notPinningFor (its requests for the image skip it).
var (
	pinPoll       = 500 * time.Millisecond
	pinWait       = 20 * time.Second
	notPinningFor = 10 * time.Minute
	// busyWait bounds how long a busy peer is asked again for a manifest, and how long
	// a blob's ancestors are asked again while every one of them is busy (they serve;
	// the registry link is what peers spare); a peer busy that long is set aside
	// (setAsideBusy: failedFor, doubled each time again, up to busyAsideMax).
	busyWait     = time.Minute
	busyAsideMax = 10 * time.Minute
)

func (s *Source) get(ctx context.Context, node, repo, kind string, chain []digest.Digest, d digest.Digest, from int64, stored, hop bool) (*http.Response, error) {
	url := "https://" + node + "/v2/" + mirror.PathFor(repo) + "/" + kind + "/" + d.String()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if len(chain) > 0 {
		parts := make([]string, len(chain))
		for i, c := range chain {
			parts[i] = c.String()
		}
		req.Header.Set(mirror.ChainHeader, strings.Join(parts, ","))
	}
	if hop || stored {
		req.Header.Set(mirror.HopHeader, "1")
	}
	if stored {
		req.Header.Set(mirror.StoredOnlyHeader, "1")
	}
	if from > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(from, 10)+"-")
	}
	// The stall bound counts from the request: a peer that sends nothing for
	// stallAfter, not even a 102 Processing (a peer working on its answer sends one
	// every progressEvery), is left.
	// While the peer's connection brings bytes for other requests, this one waits
	// behind them (stillHearing), up to queuedFor.
	rctx, cancel := context.WithCancelCause(ctx)
	var quiet atomic.Int64 // since when the request heard nothing (Unix nanoseconds)
	quiet.Store(time.Now().UnixNano())
	silent := newStall(func(t *time.Timer) {
		if s.stillHearing(node, time.Unix(0, quiet.Load())) {
			t.Reset(stallAfter)
			return
		}
		cancel(errSilent)
	})
	var connected atomic.Bool
	trace := &httptrace.ClientTrace{Got1xxResponse: func(int, textproto.MIMEHeader) error {
		connected.Store(true)
		s.hear(node)
		quiet.Store(time.Now().UnixNano())
		if rctx.Err() == nil {
			silent.Reset(stallAfter)
		}
		return nil
	}, GotConn: func(httptrace.GotConnInfo) { connected.Store(true) }}
	resp, err := s.Client.Do(req.WithContext(httptrace.WithClientTrace(rctx, trace)))
	silent.Stop()
	if err == nil {
		s.hear(node)
	}
	if err == nil && rctx.Err() != nil {
		// The bound (or ctx) ended the request as its answer came: the body is cut.
		err = context.Cause(rctx)
		resp.Body.Close()
	}
	if err != nil {
		switch {
		case errors.Is(context.Cause(rctx), errSilent) && ctx.Err() == nil && !connected.Load():
			// No connection yet (one to a peer is made at a time, and it is slow): the
			// request was never sent.
			s.Stats.Slow.Add(1)
			err = fmt.Errorf("%s: no connection within %s: %w", url, stallAfter, errSlow)
		case errors.Is(context.Cause(rctx), errSilent) && ctx.Err() == nil:
			// It took the request and sent nothing, not even a 102 Processing (one
			// every progressEvery while it works): a peer short of CPU looks so, as
			// does this node when its own reader did not run. A peer that is gone
			// loses its connection (the transport pings a silent one): this one is
			// slow, asked again, and set aside only when so for a whole busyWait. At
			// 500 nodes on two cores, taken for failing peers (set aside for every
			// blob), the silent ones had their children climb to their grandparents,
			// which uploaded up to 4.85 copies of the set.
			s.Stats.Slow.Add(1)
			err = fmt.Errorf("%s: nothing for %s: %w: %w", url, stallAfter, errSilent, errSlow)
		case timedOut(ctx, err):
			s.Stats.Slow.Add(1)
			err = fmt.Errorf("%w: %w", errSlow, err)
		case ctx.Err() == nil && connected.Load() && lostConnection(err):
			// The connection ended before the answer (or while the request was sent),
			// with every request on it (a FIN, or a reset when the peer closed it with
			// bytes unread): Go's HTTP/2 server drops a connection whose first frames
			// it has not read 2 s after the handshake, which a peer short of CPU does
			// (at 500 nodes on 2 CPUs every "unexpected EOF" set-aside was one). A peer
			// gone refuses the next connection: this one is slow, asked again.
			s.Stats.Slow.Add(1)
			s.Stats.conns.add("client: connection ended before an answer")
			err = fmt.Errorf("%s: the connection ended before its answer: %w: %w", url, err, errSlow)
		}
		cancel(nil)
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: &hearing{ReadCloser: resp.Body, h: s.health, node: node}, cancel: cancel}
	if resp.StatusCode != http.StatusServiceUnavailable {
		s.answered(node)
	}
	switch {
	case resp.StatusCode == http.StatusOK || (from > 0 && resp.StatusCode == http.StatusPartialContent):
		return resp, nil
	case resp.StatusCode == http.StatusNotFound && resp.Header.Get(mirror.NotPinnedHeader) != "":
		resp.Body.Close()
		return nil, errNotPinned
	case resp.StatusCode == http.StatusServiceUnavailable:
		resp.Body.Close()
		return nil, errBusy
	case resp.StatusCode == http.StatusNotFound:
		resp.Body.Close()
		return nil, errNotThere
	}
	resp.Body.Close()
	return nil, fmt.Errorf("%s: %s", url, resp.Status)
}

// Manifest asks this node's ancestors in d's tree (laid as a blob's is), nearest first:
// each fills it the same way while it answers, so a manifest's head sends it to its
// children only, not to every node. Then the nodes in d's order, then the registry at
// this node's turn; each answer is checked against d and read no further than size
// (the index's, when chain[0] gives one; -1: maxManifest). At the registry's turn it
// asks the nodes whose seeds hold d (HeldPath) and are not set aside first. A node
// set aside comes after the registry and is asked once (a holder for what it holds
// only): it is not waited on, busy or not pinning yet, until its time is up. The
// holders this node knows of already (summaries it has) are asked before all.
//
// Only a node weighing more in d's order (an ancestor, or before this node) is asked
// to fill the manifest from its own peers: the others are asked for what they hold or
// their registry has (mirror.HopHeader). Every request that travels on goes to a node
// weighing more, so none ever comes back to a node that waits on it.
//
// The peers' summaries are fetched at the registry's turn only: a node getting the
// manifest from a node before it in the order (the head, which asks the holders
// itself) asks no peer for its summary. Fetched before the order, every node asked
// every peer at its first manifest, N(N-1) requests, each a TLS connection to a peer
// it never asks for anything else.
func (s *Source) Manifest(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64) ([]byte, string, error) {
	var errs []error
	asked := map[string]bool{}
	fromPeer := func(node string, how asking, hop bool, why string) ([]byte, string, bool) {
		asked[node] = true
		data, mt, err := s.peerManifest(ctx, node, repo, chain, d, size, how, hop)
		if err != nil {
			errs = append(errs, fmt.Errorf("peer %s%s: %w", node, why, err))
			return nil, "", false
		}
		s.Stats.FromPeers.Add(int64(len(data)))
		return data, mt, true
	}
	fromHolders := func(holders []string) ([]byte, string, bool) {
		for _, node := range holders {
			if asked[node] || ctx.Err() != nil {
				continue
			}
			if data, mt, ok := fromPeer(node, holding, true, " (its seeds hold it)"); ok {
				return data, mt, true
			}
		}
		return nil, "", false
	}
	known, _ := s.holders(ctx, d, false)
	if data, mt, ok := fromHolders(known); ok {
		return data, mt, nil
	}
	for _, node := range s.ancestors(d) {
		if ctx.Err() != nil {
			return nil, "", ctx.Err()
		}
		if asked[node] {
			continue
		}
		if data, mt, ok := fromPeer(node, waiting, false, ""); ok {
			return data, mt, nil
		}
	}
	// The tree did not send it: the nodes of the order, those weighing more asked to
	// fill it, the others for what they have.
	order, pos := s.tree(d)
	heavier := func(n string) bool { i := slices.Index(order, n); return i >= 0 && i < pos }
	var asideHolders []string
	for _, node := range s.order(d) {
		if ctx.Err() != nil {
			// Nobody waits for it any more (the pull or the peer's request ended, and
			// the mirror's shared fetch with it): asking on would fail at every node
			// left, and at the registry's turn fetch every peer's summary for nothing.
			return nil, "", ctx.Err()
		}
		if asked[node] {
			continue
		}
		if node == self {
			var live []string
			live, asideHolders = s.holders(ctx, d, true)
			if data, mt, ok := fromHolders(live); ok {
				return data, mt, nil
			}
			data, mt, err := s.Registry.Manifest(ctx, repo, chain, d, size)
			if err == nil {
				return data, mt, nil
			}
			errs = append(errs, fmt.Errorf("registry: %w", err))
			continue
		}
		how := waiting
		if s.isAside(node) {
			how = once
			if slices.Contains(asideHolders, node) {
				how = storedOnly
			}
		}
		if data, mt, ok := fromPeer(node, how, !heavier(node), ""); ok {
			return data, mt, nil
		}
	}
	return nil, "", errors.Join(errs...)
}

// maxManifest bounds a manifest from a peer (the distribution spec's limit, and the
// mirror's): a peer sending more is sending wrong bytes.
const maxManifest = 4 << 20

// holders are the peers (not this node) whose seeds hold d, in d's order: the registry
// may well not have it, and asking the nodes one by one finds only them. Those set
// aside are apart (aside): they are skipped until their time is up, so that a holder
// busy for ever (it answers 503 to all) costs each node a busy window only when its
// set-aside ends, not every fetch of a digest its summary lists. With fetch, the
// peers' summaries are fetched as holdings.of says (at the registry's turn only);
// without, only those this node has are read.
func (s *Source) holders(ctx context.Context, d digest.Digest, fetch bool) (live, aside []string) {
	if s.held == nil {
		return nil, nil
	}
	var nodes []string
	for _, n := range s.Nodes() {
		if n != s.Self && !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	if len(nodes) == 0 {
		return nil, nil
	}
	var held []string
	if fetch {
		held = s.held.of(ctx, nodes, d)
	} else {
		held = s.held.known(nodes, d)
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range held {
		if now.Before(s.bad[n]) {
			aside = append(aside, n)
		} else {
			live = append(live, n)
		}
	}
	return live, aside
}

// peerManifest is d from node, read with the blobs' stall bound (a peer that stops
// sending is left after stallAfter, and every request joined to the fetch with it)
// and at most size bytes (-1: maxManifest); it sets the peer aside when it fails, for
// corruptFor when it sends another size or bytes that do not match d.
func (s *Source) peerManifest(parent context.Context, node, repo string, chain []digest.Digest, d digest.Digest, size int64, how asking, hop bool) ([]byte, string, error) {
	data, mt, err := s.peerManifestOnce(parent, node, repo, chain, d, size, how, hop, true)
	if errors.Is(err, errCutShort) {
		// It ended the answer before its last byte: it is up (a peer gone refuses the
		// connection), asked once more before it is set aside.
		return s.peerManifestOnce(parent, node, repo, chain, d, size, once, hop, false)
	}
	return data, mt, err
}

// errCutShort: a peer's answer ended before the length it announced.
var errCutShort = errors.New("the answer ended before its announced length")

// peerManifestOnce is one request of peerManifest; with cutOnce, an answer cut short is
// errCutShort and the peer is not set aside for it.
func (s *Source) peerManifestOnce(parent context.Context, node, repo string, chain []digest.Digest, d digest.Digest, size int64, how asking, hop, cutOnce bool) ([]byte, string, error) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	resp, err := s.ask(ctx, node, repo, "manifests", chain, d, 0, how, hop)
	if err != nil {
		if !errors.Is(err, errNotThere) && parent.Err() == nil {
			s.setAside(node, failedFor, err)
		}
		return nil, "", err
	}
	defer resp.Body.Close()
	limit := int64(maxManifest)
	if size >= 0 {
		limit = min(size, maxManifest)
	}
	switch {
	case size >= 0 && resp.ContentLength >= 0 && resp.ContentLength != size:
		err := fmt.Errorf("announced a manifest of %d bytes, the index gives %d: %w", resp.ContentLength, size, mirror.ErrSize)
		s.wrongBytes(node, err)
		return nil, "", err
	case resp.ContentLength > limit:
		err := fmt.Errorf("announced a manifest of %d bytes, more than %d: %w", resp.ContentLength, limit, mirror.ErrSize)
		s.wrongBytes(node, err)
		return nil, "", err
	}
	st := &stalling{r: resp.Body}
	st.quiet.Store(time.Now().UnixNano())
	st.t = newStall(func(t *time.Timer) {
		if s.stillHearing(node, time.Unix(0, st.quiet.Load())) {
			t.Reset(stallAfter)
			return
		}
		cancel()
	})
	defer st.t.Stop()
	data, err := io.ReadAll(io.LimitReader(st, limit+1))
	switch {
	case err != nil && parent.Err() != nil:
	case err != nil && ctx.Err() != nil:
		err = fmt.Errorf("sent nothing for %s: %w", stallAfter, err)
		s.setAside(node, failedFor, err)
	case cutOnce && lostConnection(err):
		err = fmt.Errorf("%w: %w", errCutShort, err)
	case err != nil:
		s.setAside(node, failedFor, err)
	case int64(len(data)) > limit:
		err = fmt.Errorf("sent a manifest of more than %d bytes: %w", limit, mirror.ErrSize)
		s.wrongBytes(node, err)
	case !mirror.Matches(data, d):
		err = errors.New("sent a manifest that does not match its digest")
		s.wrongBytes(node, err)
	case size >= 0 && int64(len(data)) != size:
		// The right bytes (the digest matches), fewer than the index naming them gives:
		// the index is wrong, not the peer.
		err = fmt.Errorf("sent a manifest of %d bytes, the index gives %d: %w", len(data), size, mirror.ErrSize)
	}
	if err != nil {
		return nil, "", err
	}
	return data, resp.Header.Get("Content-Type"), nil
}

// stalling resets t at each read that brings bytes.
type stalling struct {
	r     io.Reader
	t     *time.Timer
	quiet atomic.Int64 // the last byte's time (Unix nanoseconds)
}

func (s *stalling) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if n > 0 {
		s.quiet.Store(time.Now().UnixNano())
		s.t.Reset(stallAfter)
	}
	return n, err
}

// newStall is a timer firing fire(itself) after stallAfter.
func newStall(fire func(*time.Timer)) *time.Timer {
	var mu sync.Mutex
	var t *time.Timer
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(stallAfter, func() {
		mu.Lock()
		self := t
		mu.Unlock()
		fire(self)
	})
	return t
}
