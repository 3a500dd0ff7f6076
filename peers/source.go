package peers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
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

// Source is the mirror's Source on a node with peers: each digest from the nodes in
// its rendezvous order, this node's turn being the registry.
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

	*health
	// hop marks requests made for a peer's request (Forwarding): their receiver asks
	// no further peer.
	hop bool
}

// health is what a node learnt of its peers, shared by its Sources.
type health struct {
	mu  sync.Mutex
	bad map[string]time.Time // a peer set aside until then
	// notPinning are the peers found not to pin an image (peer and root manifest).
	notPinning map[[2]string]time.Time
}

// NewSource is a Source (see its fields).
func NewSource(self string, nodes func() []string, registry mirror.Source, client *http.Client, stats *Stats, log logrus.FieldLogger) *Source {
	return &Source{Self: self, Nodes: nodes, Registry: registry, Client: client, Stats: stats, Log: log,
		health: &health{bad: map[string]time.Time{}, notPinning: map[[2]string]time.Time{}}}
}

// Forwarding is this Source for what a node needs to answer a peer's request (the
// manifests above what it asks for): a peer asked by it answers from its store or the
// registry, never asking a third node, so requests never go round between nodes.
func (s *Source) Forwarding() *Source {
	f := *s
	f.hop = true
	return &f
}

// ask is get, asking again while the peer does not pin the image yet (root: the
// pinned manifest the request leads to), up to pinWait once per peer and image.
func (s *Source) ask(ctx context.Context, node, repo, kind string, chain []digest.Digest, d digest.Digest, from int64) (*http.Response, error) {
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
		resp, err := s.get(ctx, node, repo, kind, chain, d, from)
		if errors.Is(err, errBusy) {
			if time.Since(start) >= busyWait {
				// Busy for a whole window: every digest it heads would cost each asker
				// as much. Set aside, as a peer that fails.
				s.setAside(node, failedFor, fmt.Errorf("busy for %s: %w", busyWait, err))
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

func (s *Source) setAside(node string, d time.Duration, why error) {
	if node == self {
		return
	}
	s.mu.Lock()
	s.bad[node] = time.Now().Add(d)
	s.mu.Unlock()
	s.Log.WithError(why).WithField("peer", node).WithField("for", d).Warn("peers: setting a peer aside")
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
	// busyWait bounds how long a busy peer is asked again (it serves; the registry
	// link is what peers spare); a peer busy that long is set aside for failedFor.
	busyWait = time.Minute
)

func (s *Source) get(ctx context.Context, node, repo, kind string, chain []digest.Digest, d digest.Digest, from int64) (*http.Response, error) {
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
	if s.hop {
		req.Header.Set(mirror.HopHeader, "1")
	}
	if from > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(from, 10)+"-")
	}
	resp, err := s.Client.Do(req)
	if err != nil {
		return nil, err
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

// Manifest asks the nodes in d's order, checking what each sends against d.
func (s *Source) Manifest(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest) ([]byte, string, error) {
	var errs []error
	for _, node := range s.order(d) {
		if node == self {
			data, mt, err := s.Registry.Manifest(ctx, repo, chain, d)
			if err == nil {
				return data, mt, nil
			}
			errs = append(errs, fmt.Errorf("registry: %w", err))
			continue
		}
		data, mt, err := s.peerManifest(ctx, node, repo, chain, d)
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

// peerManifest is d from node, read with the blobs' stall bound (a peer that stops
// sending is left after stallAfter, and every request joined to the fetch with it)
// and at most maxManifest bytes; it sets the peer aside when it fails.
func (s *Source) peerManifest(parent context.Context, node, repo string, chain []digest.Digest, d digest.Digest) ([]byte, string, error) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	resp, err := s.ask(ctx, node, repo, "manifests", chain, d, 0)
	if err != nil {
		if !errors.Is(err, errNotThere) && parent.Err() == nil {
			s.setAside(node, failedFor, err)
		}
		return nil, "", err
	}
	defer resp.Body.Close()
	if resp.ContentLength > maxManifest {
		err := fmt.Errorf("announced a manifest of %d bytes, more than %d", resp.ContentLength, maxManifest)
		s.setAside(node, corruptFor, err)
		return nil, "", err
	}
	stall := time.AfterFunc(stallAfter, cancel)
	defer stall.Stop()
	data, err := io.ReadAll(io.LimitReader(&stalling{r: resp.Body, t: stall}, maxManifest+1))
	switch {
	case err != nil && parent.Err() != nil:
	case err != nil && ctx.Err() != nil:
		err = fmt.Errorf("sent nothing for %s: %w", stallAfter, err)
		s.setAside(node, failedFor, err)
	case err != nil:
		s.setAside(node, failedFor, err)
	case len(data) > maxManifest:
		err = fmt.Errorf("sent a manifest of more than %d bytes", maxManifest)
		s.setAside(node, corruptFor, err)
	case digest.FromBytes(data) != d:
		err = errors.New("sent a manifest that does not match its digest")
		s.setAside(node, corruptFor, err)
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

// Blob reads d, of size bytes (its descriptor's), from the first node in its order
// that has it (the first fetches it from the registry), going on to the next from
// where it stopped when one fails. A peer announcing another size is refused before
// anything is read, and one sending more than size bytes ends the read; both are set
// aside as a peer sending wrong bytes is.
func (s *Source) Blob(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64) (io.ReadCloser, int64, error) {
	if size < 0 {
		return nil, 0, fmt.Errorf("%s: no size known: %w", d, mirror.ErrSize)
	}
	r := &resumer{s: s, ctx: ctx, repo: repo, chain: chain, d: d, todo: s.order(d), size: size, verifier: d.Verifier()}
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

	todo     []string // who is left to ask
	node     string   // who is sending now
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
	for len(r.todo) > 0 {
		node := r.todo[0]
		r.todo = r.todo[1:]
		ctx, cancel := context.WithCancel(r.ctx)
		body, err := r.open(ctx, node)
		if err != nil {
			cancel()
			switch {
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
	return fmt.Errorf("no node could send %s: %w", r.d, errors.Join(r.errs...))
}

// open is node's stream of the blob from r.off, refused when it announces another
// size than the descriptor's.
func (r *resumer) open(ctx context.Context, node string) (io.ReadCloser, error) {
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
	resp, err := r.s.ask(ctx, node, r.repo, "blobs", r.chain, r.d, r.off)
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
				// next request for it (the runtime's retry) goes elsewhere.
				err = fmt.Errorf("%d bytes that do not match %s", r.off, r.d)
				for _, s := range r.senders {
					r.s.setAside(s, corruptFor, err)
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

func (c counted) Manifest(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest) ([]byte, string, error) {
	data, mt, err := c.Source.Manifest(ctx, repo, chain, d)
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
