package peers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/seed"
)

// HeldPath is where a node tells its peers what it holds: the digests of every
// manifest and blob its store can serve them (of the images it pins: Server.Held) and of
// its complete seeds (package seed), as JSON, with an ETag. A node that holds nothing
// answers an empty list.
//
// It is how one node serves a whole cluster with the registry gone: a node about to ask
// the registry for a digest (the head of a blob's tree, or any node for a manifest) asks
// a node whose summary names it first, for what it holds only. Every other node gets the
// blob down the tree from the head as with a registry, so a blob costs each node one
// request, not one per peer in turn. A summary is fetched once per peer and asked again
// (If-None-Match) after heldFor, when it is wanted; it is not trusted beyond saying whom
// to ask first: what a holder sends is checked against its digest as what any peer
// sends is.
const HeldPath = "/imagepin/v1/held"

// heldSummary is HeldPath's body.
type heldSummary struct {
	Digests []digest.Digest `json:"digests"`
}

// maxHeld bounds a summary read from a peer (about 70 bytes a digest: a million
// manifests and blobs).
const maxHeld = 80 << 20

// HeldFunc says what the node's store can serve its peers of the images it pins: the
// digests of their manifests and blobs it holds.
type HeldFunc func(context.Context) ([]digest.Digest, error)

// heldRebuild is how often a node's summary is made again from its store: a fill
// changes what it holds, so the summary, and its ETag, change at most this often.
var heldRebuild = 10 * time.Second

// heldServer serves this node's summary, made again when the seed records' directory
// changed (a record written, renamed or removed) or heldRebuild passed.
type heldServer struct {
	dir string // "": no seeds
	// pinned is what the store holds of the images the node pins (nil: nothing but
	// seeds).
	pinned HeldFunc

	mu    sync.Mutex
	mtime time.Time
	at    time.Time
	body  []byte
	etag  string
	err   error
}

func (h *heldServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, etag, err := h.summary(r.Context())
	if err != nil {
		// An unreadable record: a peer asks the registry and the tree as without it.
		http.Error(w, "the seed records cannot be read", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("ETag", etag)
	if r.Header.Get("If-None-Match") == etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(body)
}

func (h *heldServer) summary(ctx context.Context) ([]byte, string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var mtime time.Time
	if h.dir != "" {
		if fi, err := os.Stat(h.dir); err == nil {
			mtime = fi.ModTime()
		}
	}
	if h.body != nil && mtime.Equal(h.mtime) && time.Since(h.at) < heldRebuild {
		return h.body, h.etag, h.err
	}
	h.mtime, h.at = mtime, time.Now()
	var ds []digest.Digest
	if h.dir != "" {
		ds, h.err = seed.Held(h.dir)
	}
	if h.pinned != nil {
		// A store that cannot say leaves the seeds: the summary is a hint, and a peer
		// finds what it lacks down the blob's tree.
		if more, err := h.pinned(ctx); err == nil {
			ds = append(ds, more...)
		}
	}
	if ds == nil {
		ds = []digest.Digest{}
	}
	slices.Sort(ds)
	ds = slices.Compact(ds)
	h.body, _ = json.Marshal(heldSummary{Digests: ds})
	sum := sha256.Sum256(h.body)
	h.etag = `"` + hex.EncodeToString(sum[:8]) + `"`
	return h.body, h.etag, h.err
}

// heldFor is how long a peer's summary is used before it is asked again (heldRetry
// after a failure, twice as long after each failure in a row, up to heldFor); heldWait
// bounds the wait for the summaries not fetched yet.
var (
	heldFor   = 30 * time.Second
	heldRetry = 2 * time.Second
	heldWait  = 5 * time.Second
)

// heldAtOnce bounds the summaries a node asks for at once; the others wait their turn,
// the peers weighing most in the digest wanted first (the top of its tree: those that
// have it first). A node at its registry turn asked every peer at once: at 500 nodes
// short of CPU that was 499 TLS handshakes started together, most of them timing out
// (52,000 of 60,000 summary requests failed in one run), each one more handshake for
// two starved nodes, and asked again after heldRetry.
var heldAtOnce = 8

// heldWithin bounds one summary's request: its TLS handshake is given handshakeWithin
// (a slow peer is not a bad one), its answer heldWait more.
func heldWithin() time.Duration { return handshakeWithin + heldWait }

// holdings are the peers' summaries as this node fetched them, shared by its Sources.
type holdings struct {
	client *http.Client
	log    logrus.FieldLogger

	mu sync.Mutex
	by map[string]*summary // by peer address
	// queue are the summaries to ask for, in the order wanted; asking counts the
	// requests under way (at most heldAtOnce).
	queue  []heldJob
	asking int
	// fetches counts the summaries asked of peers (a test's measure).
	fetches int
}

// heldJob is a summary to ask for: node's, s.
type heldJob struct {
	node string
	s    *summary
}

// summary is one peer's summary.
type summary struct {
	etag string
	has  digestSet
	at   time.Time     // when fetched (or failed)
	done chan struct{} // open while a fetch runs
	// fails are the fetches failed in a row: the next one waits heldRetry<<(fails-1),
	// up to heldFor.
	fails int
}

// digestSet is a summary's digests kept small: the first 16 bytes of the SHA-256 of
// each, sorted. A peer's summary of 5,000 blobs costs 80 KB here (a map of the digests
// would cost half a megabyte), and a node keeps one for each peer it asked. Two
// digests sharing those bytes would cost one request for nothing.
type digestSet [][16]byte

func newDigestSet(ds []digest.Digest) digestSet {
	set := make(digestSet, 0, len(ds))
	for _, d := range ds {
		set = append(set, digestKey(d))
	}
	slices.SortFunc(set, func(a, b [16]byte) int { return bytes.Compare(a[:], b[:]) })
	return slices.Compact(set)
}

func digestKey(d digest.Digest) [16]byte {
	sum := sha256.Sum256([]byte(d))
	return [16]byte(sum[:16])
}

// contains says whether d is in the set.
func (s digestSet) contains(d digest.Digest) bool {
	k := digestKey(d)
	_, ok := slices.BinarySearchFunc(s, k, func(a, b [16]byte) int { return bytes.Compare(a[:], b[:]) })
	return ok
}

func newHoldings(client *http.Client, log logrus.FieldLogger) *holdings {
	return &holdings{client: client, log: log, by: map[string]*summary{}}
}

// of are the nodes whose summary names d, in d's rendezvous order. A peer's summary is
// fetched the first time it is wanted, heldAtOnce at a time in d's order, waited for at
// most heldWait (a peer that does not answer in time counts as holding nothing for now);
// one older than heldFor (heldRetry after a failure) is fetched again in the
// background, the last one used meanwhile: a peer that is down costs the wait once, not
// at every blob.
func (h *holdings) of(ctx context.Context, nodes []string, d digest.Digest) []string {
	if h == nil || ctx.Err() != nil {
		// A fetch nobody waits for any more wants no summary: fetched for it, they
		// would be handshakes with every peer for nothing.
		return nil
	}
	var waits []chan struct{}
	h.mu.Lock()
	for _, n := range Order(d, nodes) {
		s := h.by[n]
		switch {
		case s == nil:
			s = &summary{}
			h.by[n] = s
		case s.done != nil:
			if s.at.IsZero() {
				waits = append(waits, s.done) // its first fetch
			}
			continue
		case time.Since(s.at) < heldFor:
			continue
		}
		s.done = make(chan struct{})
		if s.at.IsZero() {
			waits = append(waits, s.done)
		}
		h.queue = append(h.queue, heldJob{n, s})
	}
	for h.asking < heldAtOnce && len(h.queue) > 0 {
		h.asking++
		go h.work()
	}
	h.mu.Unlock()
	timeout := time.NewTimer(heldWait)
	defer timeout.Stop()
wait:
	for _, c := range waits {
		select {
		case <-c:
		case <-timeout.C:
			break wait
		case <-ctx.Done():
			return nil
		}
	}
	return h.known(nodes, d)
}

// known are the nodes whose summary names d, in d's rendezvous order, of the summaries
// this node has: none is fetched.
func (h *holdings) known(nodes []string, d digest.Digest) []string {
	if h == nil {
		return nil
	}
	var out []string
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range Order(d, nodes) {
		if s := h.by[n]; s != nil && s.has.contains(d) {
			out = append(out, n)
		}
	}
	return out
}

// work asks for the summaries queued, one after another, until none is left.
func (h *holdings) work() {
	h.mu.Lock()
	for len(h.queue) > 0 {
		j := h.queue[0]
		h.queue = h.queue[1:]
		h.fetches++
		etag := j.s.etag // no other fetch of it runs (done is open)
		h.mu.Unlock()
		h.fetch(j.node, j.s, etag)
		h.mu.Lock()
	}
	h.asking--
	h.mu.Unlock()
}

// fetch asks node for its summary (etag: the one held) and keeps what it answers; a
// failure keeps the last summary, and the peer is asked again after heldRetry, twice as
// long after each failure in a row, up to heldFor: a peer too slow to shake hands (it,
// or this node, starved of CPU) is not asked again every heldRetry, each time one more
// TLS handshake for the starved nodes to make.
func (h *holdings) fetch(node string, s *summary, etag string) {
	ctx, cancel := context.WithTimeout(context.Background(), heldWithin())
	defer cancel()
	has, newTag, err := h.get(ctx, node, etag)
	h.mu.Lock()
	defer h.mu.Unlock()
	s.at = time.Now()
	if err != nil {
		// Asked again sooner than a summary that came.
		s.fails++
		s.at = s.at.Add(heldBackoff(s.fails) - heldFor)
		h.log.WithError(err).WithField("peer", node).Debug("peers: no summary of what the peer's seeds hold")
	} else {
		s.fails = 0
		if has != nil {
			s.has, s.etag = has, newTag
		}
	}
	close(s.done)
	s.done = nil
}

// heldBackoff is how long a summary is not asked again after fails failures in a row.
func heldBackoff(fails int) time.Duration {
	if fails > 8 {
		return heldFor
	}
	return min(heldRetry<<max(fails-1, 0), heldFor)
}

// get is node's summary: nil and etag when it did not change.
func (h *holdings) get(ctx context.Context, node, etag string) (digestSet, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+node+HeldPath, nil)
	if err != nil {
		return nil, "", err
	}
	if etag != "" {
		req.Header.Set("If-None-Match", etag)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNotModified:
		return nil, etag, nil
	case http.StatusOK:
	default:
		return nil, "", fmt.Errorf("%s: %s", HeldPath, resp.Status)
	}
	var sum heldSummary
	dec := json.NewDecoder(io.LimitReader(resp.Body, maxHeld))
	if err := dec.Decode(&sum); err != nil {
		return nil, "", fmt.Errorf("%s: %w", HeldPath, err)
	}
	good := sum.Digests[:0]
	for _, d := range sum.Digests {
		if d.Validate() == nil {
			good = append(good, d)
		}
	}
	return newDigestSet(good), resp.Header.Get("ETag"), nil
}
