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
	"syscall"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/mirror"
)

// Stats are a node's blob and manifest bytes by where they came from or went.
type Stats struct {
	// FromRegistry: fetched from a registry (for this node or for a peer).
	FromRegistry atomic.Int64
	// FromPeers: read from other nodes.
	FromPeers atomic.Int64
	// ToPeers: served to other nodes.
	ToPeers atomic.Int64

	// byImage are FromRegistry by pinned image ("repo@digest" of the pinned manifest
	// the bytes belong to).
	byImage sync.Map // string → *atomic.Int64
}

// RegistryBytes are the bytes fetched from registries for the pinned image ref.
func (s *Stats) RegistryBytes(ref string) int64 {
	if v, ok := s.byImage.Load(ref); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

func (s *Stats) fromRegistry(repo string, chain []digest.Digest, d digest.Digest) *atomic.Int64 {
	root := d
	if len(chain) > 0 {
		root = chain[len(chain)-1]
	}
	v, _ := s.byImage.LoadOrStore(repo+"@"+root.String(), new(atomic.Int64))
	return v.(*atomic.Int64)
}

// How long a peer is set aside after a failure, and after serving wrong bytes.
var (
	failedFor  = 30 * time.Second
	corruptFor = 10 * time.Minute
	// stallAfter switches to the next node when a transfer sends nothing this long.
	stallAfter = 15 * time.Second
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
	// hop marks requests made for a peer's request (Forwarding): their receiver asks
	// no further peer.
	hop bool
}

// health is what a node learnt of its peers, shared by its Sources.
type health struct {
	mu  sync.Mutex
	bad map[string]time.Time // a peer set aside until then
	// refusing are the peers refusing connections (a peer is taken out at its next
	// connection).
	refusing map[string]*refusal
	// notPinning are the peers found not to pin an image (peer and root manifest).
	notPinning map[[2]string]time.Time
	// held are the peers' summaries of what their seeds hold (HeldPath); nil: none
	// asked.
	held *holdings
	// busyTimes are how many times in a row each peer was set aside for being busy a
	// whole busyWait, with no answer from it in between (setAsideBusy); busyUntil is
	// when its last busy set-aside ends.
	busyTimes map[string]int
	busyUntil map[string]time.Time
}

// NewSource is a Source (see its fields).
func NewSource(self string, nodes func() []string, registry mirror.Source, client *http.Client, stats *Stats, log logrus.FieldLogger) *Source {
	return &Source{Self: self, Nodes: nodes, Registry: registry, Client: client, Stats: stats, Log: log,
		health: &health{bad: map[string]time.Time{}, refusing: map[string]*refusal{}, notPinning: map[[2]string]time.Time{},
			busyTimes: map[string]int{}, busyUntil: map[string]time.Time{}, held: newHoldings(client, log)}}
}

// Forwarding is this Source for what a node needs to answer a peer's request (the
// manifests above what it asks for): a peer asked by it answers from its store or the
// registry, never asking a third node, so requests never go round between nodes.
func (s *Source) Forwarding() *Source {
	f := *s
	f.hop = true
	return &f
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
func (s *Source) ask(ctx context.Context, node, repo, kind string, chain []digest.Digest, d digest.Digest, from int64, how asking) (*http.Response, error) {
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
	for {
		if wait := s.probed(node); wait > 0 && how < once {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(wait):
			}
			continue
		}
		resp, err := s.get(ctx, node, repo, kind, chain, d, from, how == storedOnly || how == holding)
		if how >= once {
			return resp, err
		}
		if s.starting(ctx, node, err) {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(pinPoll):
			}
			continue
		}
		if errors.Is(err, errBusy) {
			if how == climbing {
				return nil, err
			}
			if time.Since(start) >= busyWait {
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

// A peer refusing connections has nothing listening at its address: it is starting (nodes
// boot, and imagepind restarts, seconds apart) or stopped. Leaving it at once would lay
// the blobs' trees without it, and each node missing a different set of peers would
// head, and fetch from the registry, blobs other nodes head: a refusing peer is asked
// again every pinPoll while it has refused for less than startWait (counted from its
// first refusal, so a stopped peer costs a node startWait once, not at each request),
// and set aside as any failing peer after that.
var startWait = 15 * time.Second

// refusal is a peer refusing connections: since its first refusal, and when it was
// last tried.
type refusal struct{ since, tried time.Time }

// starting tells whether err is node refusing a connection for less than startWait:
// ask it again. Any other outcome of a request (ctx ending it aside) ends its refusing.
func (s *Source) starting(ctx context.Context, node string, err error) bool {
	refused := errors.Is(err, syscall.ECONNREFUSED)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !refused {
		if ctx.Err() == nil {
			delete(s.refusing, node)
		}
		return false
	}
	now := time.Now()
	r := s.refusing[node]
	if r == nil {
		r = &refusal{since: now}
		s.refusing[node] = r
	}
	r.tried = now
	return now.Sub(r.since) < startWait
}

// refusedEvery is how often a peer refusing connections is tried: every pinPoll at
// first, less often the longer it refuses (every 2 s from 7.5 s on), so that the peers
// still starting cost each node a few refused connections a second in all.
func refusedEvery(since time.Duration) time.Duration {
	return min(pinPoll+since/5, 2*time.Second)
}

// probed is how long to wait before asking node, a peer refusing connections, again:
// one request tries it each refusedEvery, the others wait for what it finds (0: ask now).
func (s *Source) probed(node string) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.refusing[node]
	if r == nil || time.Since(r.since) >= startWait {
		return 0
	}
	if wait := refusedEvery(time.Since(r.since)) - time.Since(r.tried); wait > 0 {
		return wait
	}
	r.tried = time.Now()
	return 0
}

// self marks the registry's turn in an order.
const self = ""

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

// setAsideBusy sets node aside after it was busy for a whole busyWait (a manifest asked
// of it again and again, or a blob's every ancestor): for failedFor the first time, and
// twice as long each time it is found so again without answering anything in between,
// up to busyAsideMax. A peer answering 503 for ever costs each asker a busy window a
// few times an hour, not twice a minute. What counts is busy episodes, not requests:
// every fetch under way when a peer is busy (a pre-load asks for many blobs at once)
// finds it busy for its own window, and those found while its busy set-aside is in
// force add nothing (one step, one log line, per episode).
func (s *Source) setAsideBusy(node string) {
	now := time.Now()
	s.mu.Lock()
	if now.Before(s.busyUntil[node]) && now.Before(s.bad[node]) {
		s.mu.Unlock()
		return
	}
	n := s.busyTimes[node]
	s.busyTimes[node] = n + 1
	d := busyAsideMax
	if n < 16 {
		d = min(failedFor<<n, busyAsideMax)
	}
	s.busyUntil[node] = now.Add(d)
	s.mu.Unlock()
	s.setAside(node, d, fmt.Errorf("busy for %s, %d times in a row: %w", busyWait, n+1, errBusy))
}

// answered notes that node answered a request (not busy): its busy set-asides start
// again from failedFor.
func (s *Source) answered(node string) {
	s.mu.Lock()
	delete(s.busyTimes, node)
	delete(s.busyUntil, node)
	s.mu.Unlock()
}

// setAside sets node aside for d, or for what is left of an earlier set-aside when that
// is longer: a peer set aside for long (wrong bytes, busy again and again) is not taken
// back early by a request of its that failed meanwhile.
func (s *Source) setAside(node string, d time.Duration, why error) {
	if node == self {
		return
	}
	until := time.Now().Add(d)
	s.mu.Lock()
	if s.bad[node].After(until) {
		until = s.bad[node]
	} else {
		s.bad[node] = until
	}
	s.mu.Unlock()
	s.Log.WithError(why).WithField("peer", node).WithField("for", time.Until(until).Round(time.Second)).Warn("peers: setting a peer aside")
}

// errSilent is a peer that took a request and sent nothing for stallAfter.
var errSilent = errors.New("the peer took the request and sends nothing")

// cancelOnClose ends a request's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
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
)

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

func (s *Source) get(ctx context.Context, node, repo, kind string, chain []digest.Digest, d digest.Digest, from int64, stored bool) (*http.Response, error) {
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
	// A blob is asked for only up its tree (Blob): its requests need no hop mark.
	if s.hop && kind == "manifests" || stored {
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
	rctx, cancel := context.WithCancelCause(ctx)
	silent := time.AfterFunc(stallAfter, func() { cancel(errSilent) })
	trace := &httptrace.ClientTrace{Got1xxResponse: func(int, textproto.MIMEHeader) error {
		if rctx.Err() == nil {
			silent.Reset(stallAfter)
		}
		return nil
	}}
	resp, err := s.Client.Do(req.WithContext(httptrace.WithClientTrace(rctx, trace)))
	silent.Stop()
	if err == nil && rctx.Err() != nil {
		// The bound (or ctx) ended the request as its answer came: the body is cut.
		err = context.Cause(rctx)
		resp.Body.Close()
	}
	if err != nil {
		if errors.Is(context.Cause(rctx), errSilent) && ctx.Err() == nil {
			err = fmt.Errorf("%s: nothing for %s: %w", url, stallAfter, errSilent)
		}
		cancel(nil)
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
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

// Manifest asks the nodes whose seeds hold d (HeldPath) and are not set aside, then
// the nodes in d's order, checking what each sends against d, and reading none past
// size (the index's, when chain[0] gives one; -1: maxManifest). A node set aside comes
// after the registry and is asked once (a holder for what it holds only): it is not
// waited on, busy or not pinning yet, until its time is up.
func (s *Source) Manifest(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64) ([]byte, string, error) {
	var errs []error
	holders, asideHolders := s.holders(ctx, d)
	for _, node := range holders {
		data, mt, err := s.peerManifest(ctx, node, repo, chain, d, size, holding)
		if err != nil {
			errs = append(errs, fmt.Errorf("peer %s (its seeds hold it): %w", node, err))
			continue
		}
		s.Stats.FromPeers.Add(int64(len(data)))
		return data, mt, nil
	}
	for _, node := range s.order(d) {
		if slices.Contains(holders, node) {
			continue
		}
		if node == self {
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
		data, mt, err := s.peerManifest(ctx, node, repo, chain, d, size, how)
		if err != nil {
			errs = append(errs, fmt.Errorf("peer %s: %w", node, err))
			continue
		}
		s.Stats.FromPeers.Add(int64(len(data)))
		return data, mt, nil
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
// set-aside ends, not every fetch of a digest its summary lists.
func (s *Source) holders(ctx context.Context, d digest.Digest) (live, aside []string) {
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
	held := s.held.of(ctx, nodes, d)
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

// isAside tells whether node is set aside now.
func (s *Source) isAside(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Now().Before(s.bad[node])
}

// peerManifest is d from node, read with the blobs' stall bound (a peer that stops
// sending is left after stallAfter, and every request joined to the fetch with it)
// and at most size bytes (-1: maxManifest); it sets the peer aside when it fails, for
// corruptFor when it sends another size or bytes that do not match d.
func (s *Source) peerManifest(parent context.Context, node, repo string, chain []digest.Digest, d digest.Digest, size int64, how asking) ([]byte, string, error) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	resp, err := s.ask(ctx, node, repo, "manifests", chain, d, 0, how)
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
		s.setAside(node, corruptFor, err)
		return nil, "", err
	case resp.ContentLength > limit:
		err := fmt.Errorf("announced a manifest of %d bytes, more than %d: %w", resp.ContentLength, limit, mirror.ErrSize)
		s.setAside(node, corruptFor, err)
		return nil, "", err
	}
	stall := time.AfterFunc(stallAfter, cancel)
	defer stall.Stop()
	data, err := io.ReadAll(io.LimitReader(&stalling{r: resp.Body, t: stall}, limit+1))
	switch {
	case err != nil && parent.Err() != nil:
	case err != nil && ctx.Err() != nil:
		err = fmt.Errorf("sent nothing for %s: %w", stallAfter, err)
		s.setAside(node, failedFor, err)
	case err != nil:
		s.setAside(node, failedFor, err)
	case int64(len(data)) > limit:
		err = fmt.Errorf("sent a manifest of more than %d bytes: %w", limit, mirror.ErrSize)
		s.setAside(node, corruptFor, err)
	case !mirror.Matches(data, d):
		err = errors.New("sent a manifest that does not match its digest")
		s.setAside(node, corruptFor, err)
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
	r io.Reader
	t *time.Timer
}

func (s *stalling) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if n > 0 {
		s.t.Reset(stallAfter)
	}
	return n, err
}

// DefaultFanout is a Source's Fanout when none is set. Two: a blob streams down its
// tree (each node serves its children while it arrives), so one blob reaches every
// node in about the time of one copy at a node's upload rate divided by the fanout,
// plus the tree's depth (log2 of the nodes) times a hop's latency; across the many
// blobs of a set each node uploads about one copy of the set whatever the fanout.
const DefaultFanout = 2

func (s *Source) fanout() int {
	if s.Fanout < 1 {
		return DefaultFanout
	}
	return s.Fanout
}

// tree is key's rendezvous order of the nodes (this node among them) and this node's
// position in it (the last when it serves no peers), the nodes set aside left out when
// live.
func (s *Source) tree(key digest.Digest, live bool) (order []string, pos int) {
	var nodes []string
	now := time.Now()
	s.mu.Lock()
	for _, n := range s.Nodes() {
		if n != s.Self && (!live || !now.Before(s.bad[n])) && !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	s.mu.Unlock()
	if s.Self != "" {
		nodes = append(nodes, s.Self)
	}
	order = Order(key, nodes)
	pos = len(order)
	if s.Self != "" {
		pos = slices.Index(order, s.Self)
	}
	return order, pos
}

// ancestors are this node's parent in key's tree, its parent's parent and so on to
// the head, laid over the nodes not set aside: the node at position p of the order (0:
// the head) has its parent at (p-1)/Fanout. Every one of them weighs more than this
// node in key's order, whatever the peers each node knows: asking only them, and the
// registry, no request ever comes back to a node that waits on it.
func (s *Source) ancestors(key digest.Digest) []string {
	order, p := s.tree(key, true)
	k := s.fanout()
	var out []string
	for p > 0 {
		p = (p - 1) / k
		out = append(out, order[p])
	}
	return out
}

// turn is one node asked for a blob: a peer (self: the registry), asked how.
type turn struct {
	node string
	how  asking
}

// plan is who to ask for a blob, one after another: this node's ancestors in the
// blob's tree, nearest first (a busy one is left for the next at once; when all were
// busy, all are asked again after pinPoll, for up to busyWait); then the nodes whose
// seeds hold it (HeldPath) and are not set aside, for what they hold only; then the
// registry; then, when the registry fails too (gone), the other nodes once each
// (those set aside last, holders among them): those weighing more asked as ancestors
// are, the others only for what they hold (storedOnly), so that a node joining with
// the registry gone gets a blob from whoever has it.
type plan struct {
	s *Source
	d digest.Digest

	asked     map[string]bool
	chain     []string // the ancestors left to ask in this pass
	busy      []string // the ancestors busy in this pass
	busySince time.Time
	climbed   bool   // the registry's turn came
	rest      []turn // after the registry
}

// next is the next turn, false when none is left.
func (p *plan) next(ctx context.Context) (turn, bool) {
	for !p.climbed {
		for len(p.chain) > 0 {
			n := p.chain[0]
			p.chain = p.chain[1:]
			if !p.asked[n] {
				p.asked[n] = true
				return turn{n, climbing}, true
			}
		}
		// Whom the tree gives now: an ancestor set aside in this pass leaves the tree,
		// and the nodes below it move up (a dead head's first child heads).
		for _, n := range p.s.ancestors(p.d) {
			if !p.asked[n] {
				p.chain = append(p.chain, n)
			}
		}
		if len(p.chain) > 0 {
			continue
		}
		if len(p.busy) > 0 {
			busy := p.busy
			p.busy = nil
			if time.Since(p.busySince) < busyWait {
				select {
				case <-ctx.Done():
					return turn{}, false
				case <-time.After(pinPoll):
				}
			} else {
				for _, n := range busy {
					p.s.setAsideBusy(n)
				}
			}
			for _, n := range busy {
				delete(p.asked, n)
			}
			continue
		}
		p.climbed = true
		// The holders set aside are left to others (once, after the registry).
		live, _ := p.s.holders(ctx, p.d)
		for _, n := range live {
			if !p.asked[n] {
				p.rest = append(p.rest, turn{n, holding})
			}
		}
		p.rest = append(p.rest, turn{self, once})
		p.rest = append(p.rest, p.others()...)
	}
	for len(p.rest) > 0 {
		t := p.rest[0]
		p.rest = p.rest[1:]
		if !p.asked[t.node] {
			p.asked[t.node] = true
			return t, true
		}
	}
	return turn{}, false
}

// busyNow notes that node, an ancestor, was busy.
func (p *plan) busyNow(node string) {
	if len(p.busy) == 0 && p.busySince.IsZero() {
		p.busySince = time.Now()
	}
	p.busy = append(p.busy, node)
}

// others are the nodes after the registry: in the blob's order, those set aside last;
// a node weighing more is asked once, one weighing less for what it holds only.
func (p *plan) others() []turn {
	order, pos := p.s.tree(p.d, false)
	now := time.Now()
	var good, aside []turn
	p.s.mu.Lock()
	for i, n := range order {
		if i == pos {
			continue
		}
		t := turn{n, once}
		if i > pos {
			t.how = storedOnly
		}
		if now.Before(p.s.bad[n]) {
			aside = append(aside, t)
		} else {
			good = append(good, t)
		}
	}
	p.s.mu.Unlock()
	return append(good, aside...)
}

// Blob reads d, of size bytes (its descriptor's), down d's tree: from this node's
// parent, else its parent's parent and so on (the head's turn is the registry), each
// of them filling d the same way while it sends it, so that a blob crosses the
// registry link once and each node uploads it to at most Fanout children while all
// are up. It goes on from where it stopped with the next when one fails (plan). A peer
// announcing another size is refused before anything is read, and one sending more
// than size bytes ends the read; both are set aside as a peer sending wrong bytes is.
func (s *Source) Blob(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64) (io.ReadCloser, int64, error) {
	if size < 0 {
		return nil, 0, fmt.Errorf("%s: no size known: %w", d, mirror.ErrSize)
	}
	r := &resumer{s: s, ctx: ctx, repo: repo, chain: chain, d: d, size: size, verifier: d.Verifier(),
		plan: &plan{s: s, d: d, asked: map[string]bool{}}}
	if err := r.next(); err != nil {
		return nil, 0, err
	}
	return r, r.size, nil
}

// resumer reads a blob from one node after another.
type resumer struct {
	s     *Source
	ctx   context.Context
	repo  string
	chain []digest.Digest
	d     digest.Digest

	plan     *plan  // who is left to ask
	node     string // who is sending now
	cur      io.ReadCloser
	cancel   context.CancelFunc
	stall    *time.Timer
	size     int64 // the descriptor's: no sender goes past it
	off      int64
	senders  []string
	verifier digest.Verifier
	errs     []error
}

// next opens the next node that answers, at r.off.
func (r *resumer) next() error {
	r.closeCur()
	for {
		t, ok := r.plan.next(r.ctx)
		if !ok {
			break
		}
		node := t.node
		ctx, cancel := context.WithCancel(r.ctx)
		body, err := r.open(ctx, t)
		if err != nil {
			cancel()
			switch {
			case r.ctx.Err() != nil:
				return r.ctx.Err()
			case errors.Is(err, errBusy) && t.how == climbing:
				r.plan.busyNow(node)
			case node == self || errors.Is(err, errNotThere):
			case errors.Is(err, mirror.ErrSize):
				r.s.setAside(node, corruptFor, err)
			default:
				r.s.setAside(node, failedFor, err)
			}
			r.errs = append(r.errs, fmt.Errorf("%s: %w", name(node), err))
			continue
		}
		r.node, r.cur, r.cancel = node, body, cancel
		r.stall = time.AfterFunc(stallAfter, cancel)
		r.senders = append(r.senders, node)
		return nil
	}
	if r.ctx.Err() != nil {
		return r.ctx.Err()
	}
	return fmt.Errorf("no node could send %s: %w", r.d, errors.Join(r.errs...))
}

// open is t's stream of the blob from r.off, refused when it announces another size
// than the descriptor's.
func (r *resumer) open(ctx context.Context, t turn) (io.ReadCloser, error) {
	node := t.node
	if node == self {
		body, announced, err := r.s.Registry.Blob(ctx, r.repo, r.chain, r.d, r.size)
		if err != nil {
			return nil, err
		}
		if announced >= 0 && announced != r.size {
			body.Close()
			return nil, fmt.Errorf("announced %d bytes, the manifest gives %d: %w", announced, r.size, mirror.ErrSize)
		}
		if r.off > 0 {
			// The registry is read from its first byte: skip what was read.
			if _, err := io.CopyN(io.Discard, body, r.off); err != nil {
				body.Close()
				return nil, err
			}
		}
		return body, nil
	}
	// Every byte came and the end did not (the sender was cut after its last byte): a
	// range from r.off would be one past the end (416), so the blob is asked whole.
	from := r.off
	if from >= r.size {
		from = 0
	}
	resp, err := r.s.ask(ctx, node, r.repo, "blobs", r.chain, r.d, from, t.how)
	if err != nil {
		return nil, err
	}
	whole := resp.StatusCode == http.StatusOK
	want := r.size
	if !whole {
		want = r.size - r.off // a 206 from r.off
	}
	if resp.ContentLength >= 0 && resp.ContentLength != want {
		resp.Body.Close()
		return nil, fmt.Errorf("announced %d bytes, the manifest gives %d: %w", resp.ContentLength, want, mirror.ErrSize)
	}
	if whole && r.off > 0 {
		if _, err := io.CopyN(io.Discard, resp.Body, r.off); err != nil {
			resp.Body.Close()
			return nil, err
		}
	}
	return resp.Body, nil
}

func name(node string) string {
	if node == self {
		return "registry"
	}
	return "peer " + node
}

func (r *resumer) closeCur() {
	if r.cur != nil {
		r.stall.Stop()
		r.cur.Close()
		r.cancel()
		r.cur = nil
	}
}

func (r *resumer) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if r.cur == nil {
			return 0, io.ErrUnexpectedEOF
		}
		n, err := r.read(p)
		if errors.Is(err, mirror.ErrSize) {
			err = fmt.Errorf("%s: %w", r.d, err)
			if r.node != self {
				r.s.setAside(r.node, corruptFor, err)
			}
			return 0, err
		}
		if n > 0 {
			r.stall.Reset(stallAfter)
			r.off += int64(n)
			r.verifier.Write(p[:n])
			if r.node != self {
				r.s.Stats.FromPeers.Add(int64(n))
			}
		}
		if err == io.EOF && r.size >= 0 && r.off < r.size {
			err = io.ErrUnexpectedEOF
		}
		switch {
		case err == io.EOF:
			if !r.verifier.Verified() {
				// Whoever sent bytes of this blob is suspect: set them aside, so the
				// next request for it (the runtime's retry) goes elsewhere. Of two or
				// more, one may be innocent: a node relaying a blob that turns out
				// wrong cuts it (it never sends a whole wrong blob), and this node
				// resumed elsewhere after the cut. Those are set aside for failedFor.
				err = fmt.Errorf("%d bytes that do not match %s", r.off, r.d)
				aside := corruptFor
				if len(r.senders) > 1 {
					aside = failedFor
				}
				for _, s := range r.senders {
					r.s.setAside(s, aside, err)
				}
				return n, err
			}
			return n, io.EOF
		case err != nil:
			if r.ctx.Err() != nil {
				return n, r.ctx.Err()
			}
			r.errs = append(r.errs, fmt.Errorf("%s: %w", name(r.node), err))
			if r.node != self {
				r.s.setAside(r.node, failedFor, err)
			}
			if nerr := r.next(); nerr != nil {
				return n, nerr
			}
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, nil
	}
}

// read reads the current sender, never past r.size: once every byte came, only the
// end may follow (a byte more is mirror.ErrSize).
func (r *resumer) read(p []byte) (int, error) {
	if left := r.size - r.off; left <= 0 {
		var one [1]byte
		n, err := r.cur.Read(one[:])
		if n > 0 {
			return 0, fmt.Errorf("sent more than the %d bytes the manifest gives: %w", r.size, mirror.ErrSize)
		}
		return 0, err
	} else if left < int64(len(p)) {
		p = p[:left]
	}
	return r.cur.Read(p)
}

func (r *resumer) Close() error {
	r.closeCur()
	return nil
}

// CountRegistry counts in stats.FromRegistry what src (the registry) sends. It is the
// node's one way to the registry (for its own fetches, its peers' and their hops):
// its manifests are fetched once for every fetch wanting them at once (mirror.Shared).
func CountRegistry(src mirror.Source, stats *Stats) mirror.Source {
	return mirror.Shared(counted{src, stats})
}

type counted struct {
	mirror.Source
	stats *Stats
}

func (c counted) Manifest(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64) ([]byte, string, error) {
	data, mt, err := c.Source.Manifest(ctx, repo, chain, d, size)
	c.stats.FromRegistry.Add(int64(len(data)))
	c.stats.fromRegistry(repo, chain, d).Add(int64(len(data)))
	return data, mt, err
}

func (c counted) Blob(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64) (io.ReadCloser, int64, error) {
	rc, size, err := c.Source.Blob(ctx, repo, chain, d, size)
	if err != nil {
		return nil, 0, err
	}
	return &countingReader{rc, &c.stats.FromRegistry, c.stats.fromRegistry(repo, chain, d)}, size, nil
}

type countingReader struct {
	io.ReadCloser
	n, image *atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	c.image.Add(int64(n))
	return n, err
}
