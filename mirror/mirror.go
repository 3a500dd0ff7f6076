// Package mirror is the node-local, read-only registry mirror of peers: it
// answers the OCI distribution API for the manifests and blobs of pinned images only
// (404 at once for anything else, so an unpinned pull goes on to its registry
// untouched), from the node's blob store, else from a Source (the registry through the
// node's own access, or a peer), streaming to the client while it writes the store. A
// blob is served whole or by Range (serveBlob), checked against its digest either way.
//
// Paths carry the source repository whole: CRI-O is given the mirror as
// "127.0.0.1:PORT/<source prefix>", so a pull of quay.io/ns/app@sha256:… asks for
// /v2/quay.io/ns/app/manifests/sha256:…. Only digests are served (CRI-O's
// pull-from-mirror = "digest-only").
//
// The same mirror serves the node's runtime (on loopback, filling from the peers, then
// the registry) and, with a chain of manifests on each request, the other nodes (package
// peers: a blob filled from the nodes before this one in its order, then the registry,
// so requests never go round between nodes).
package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
)

// Source fetches what the store lacks: the registry through the node's own access, or
// the peers before it (package peers). chain are the manifests above d, nearest first
// (the manifest naming a blob, then the index naming that manifest): a registry needs
// the nearest to find a blob's repository; a peer needs the whole chain, up to a pinned
// manifest, to know it may serve d.
type Source interface {
	// Manifest is the manifest repo@d, as served (bytes and media type), of size bytes
	// when the manifest above it gives a size (an index's child: chain[0] names it),
	// else -1 (a pinned manifest: at most maxManifest). A source reads no sender past
	// the size and refuses a manifest of another size (ErrSize).
	Manifest(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64) ([]byte, string, error)
	// Blob streams the blob d of repo, of size bytes (its descriptor's, in the manifest
	// chain[0]), and says the size its sender announced (-1: none). A source refuses a
	// sender announcing another size and ends the stream with an error, not io.EOF,
	// past size bytes; the mirror bounds what it reads to size whatever the source.
	Blob(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64) (io.ReadCloser, int64, error)
}

// Pinned says whether repo@d is the manifest of a pinned image (by its full name, as
// in the set: "quay.io/ns/app").
type Pinned func(repo string, d digest.Digest) bool

// Stats are the bytes served, by where they came from: the store (committed, verified
// blobs), or a transfer (a blob served while it arrived, from the registry or a peer).
type Stats struct {
	FromStore, Transferred atomic.Int64
}

// Mirror keeps what may be served and the blobs being filled; Handler serves it.
type Mirror struct {
	store    *blobstore.Store
	also     Content
	onFilled func()
	pinned   Pinned
	log      logrus.FieldLogger

	mu sync.Mutex
	// children are the digests each served manifest names (config, layers, or the
	// manifests of an index), by repository, each with the manifest naming it and the
	// size it gives: the blobs the mirror may serve, and how many bytes each has.
	children map[string]map[digest.Digest]child
	// fills are the blobs being written to the store now, each read by every request
	// for it while it arrives: one transfer per blob, however many ask.
	fills map[digest.Digest]*fill
	// flights are the manifests being fetched now, by source and digest.
	flights flights[flightKey, []byte]
	// corruptInRuntime are the digests whose copy in the runtime's content store
	// (also) did not match when served: left there, read no more (but checked again
	// now and then while the runtime holds it: Prune), each with when it was last
	// found not to match.
	corruptInRuntime map[digest.Digest]time.Time
	// storeFailed is when the store last failed a write (a full disk): for a minute
	// after, blobs are streamed from the source without being stored.
	storeFailed time.Time

	// ctx ends the fills (Close); running are the fills under way.
	ctx     context.Context
	stop    context.CancelFunc
	running sync.WaitGroup
	closed  bool // under mu
}

// child is a digest a served manifest names.
type child struct {
	parent digest.Digest
	// size is the descriptor's (-1: the manifest gave none; such a blob is not
	// fetched: a fill is bounded by it).
	size int64
	// manifest: named as a manifest (by an index), not as a config or layer.
	manifest bool
}

// Content is a runtime's own content store, read-only (containerd's): what the mirror
// serves without a copy in its store.
type Content interface {
	// Reader reads d; an error errdefs.IsNotFound tells when the store holds no d, any
	// other that it could not tell (it does not answer).
	Reader(ctx context.Context, d digest.Digest) (io.ReadSeekCloser, int64, error)
	// Has says whether the store holds d; an error when it could not tell.
	Has(ctx context.Context, d digest.Digest) (bool, error)
}

// OnFilled calls fn after each blob a fill committed (set before serving).
func (m *Mirror) OnFilled(fn func()) { m.onFilled = fn }

// ReadAlso makes the mirror serve from c what its store lacks (set before serving);
// Prune then drops from the store what c holds.
func (m *Mirror) ReadAlso(c Content) { m.also = c }

// storedReader is d from the store (own), else from the runtime's content store,
// unless the copy there was found corrupted (corrupt).
func (m *Mirror) storedReader(ctx context.Context, d digest.Digest) (rd io.ReadSeekCloser, size int64, own bool, err error) {
	rd, size, err = m.store.Reader(ctx, d)
	if err == nil {
		return rd, size, true, nil
	}
	if m.also != nil && !m.isCorruptInRuntime(d) {
		rd2, size2, err2 := m.also.Reader(ctx, d)
		if err2 == nil {
			return rd2, size2, false, nil
		}
		if errdefs.IsNotFound(err) {
			// The store has none: what the runtime's says (none, or it could not tell).
			err = err2
		}
	}
	return nil, 0, false, err
}

func (m *Mirror) isCorruptInRuntime(d digest.Digest) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.corruptInRuntime[d]
	return ok
}

// Matches says whether data is d's content, hashed with d's own algorithm (sha256,
// sha512).
func Matches(data []byte, d digest.Digest) bool {
	return d.Validate() == nil && d.Algorithm().FromBytes(data) == d
}

// New builds a mirror over store, serving what pinned allows.
func New(store *blobstore.Store, pinned Pinned, log logrus.FieldLogger) *Mirror {
	ctx, stop := context.WithCancel(context.Background())
	return &Mirror{store: store, pinned: pinned, log: log, ctx: ctx, stop: stop,
		children: map[string]map[digest.Digest]child{}, fills: map[digest.Digest]*fill{},
		corruptInRuntime: map[digest.Digest]time.Time{}}
}

// Handler serves the mirror to the node's runtime, filling what the store lacks from
// src.
func (m *Mirror) Handler(src Source, stats *Stats) http.Handler {
	return &handler{m: m, src: src, manifests: src, hop: src, stats: stats}
}

// PeerHandler serves the mirror to other nodes: a request carries the manifests above
// what it asks for (ChainHeader), so a peer can ask for a blob of a pinned image whose
// manifest this node has not served yet. Blobs are filled from peers (package peers:
// only the nodes above this one in the blob's order, then the registry, so requests
// never go round between nodes), and so are the manifests of a chain this node lacks,
// except for a request marked HopHeader (a peer asks so of a node weighing less than
// itself in the manifest's order, which may wait on it) or for what this node holds
// only (StoredOnlyHeader): those from registry alone.
func (m *Mirror) PeerHandler(registry, peers Source, stats *Stats) http.Handler {
	return &handler{m: m, src: peers, manifests: peers, hop: registry, chained: true, stats: stats}
}

// StoredOnlyHeader marks a peer's request for what this node holds already (its store,
// the runtime's content store): anything else is a 404 at once, without a fill. A node
// asks so of nodes below it in a blob's order (package peers), which may wait on it.
const StoredOnlyHeader = "Imagepin-Stored-Only"

// HopHeader marks a peer's request for a manifest to be answered from the store or the
// registry alone, asking no peer: a peer asks so of a node weighing less than itself in
// the manifest's order (package peers).
const HopHeader = "Imagepin-Hop"

// ChainHeader carries, on a peer's request, the manifests above the digest asked for,
// nearest first, comma-separated: the last is a pinned manifest.
const ChainHeader = "Imagepin-Chain"

// StoredHeader is set on a blob's answer sent from this node's own copy (its store,
// the runtime's content store), not relayed from a fill: a copy that stops within its
// last HoldBack bytes was found, by this node, not to match its digest.
const StoredHeader = "Imagepin-Stored"

// NotPinnedHeader is set on a peer's 404 when this node does not pin (or not yet) the
// image asked for.
const NotPinnedHeader = "Imagepin-Not-Pinned"

// Chain is the manifests above d in repo as this mirror learnt them, nearest first.
func (m *Mirror) Chain(repo string, d digest.Digest) []digest.Digest {
	m.mu.Lock()
	defer m.mu.Unlock()
	var chain []digest.Digest
	for cur := d; len(chain) < 4; {
		c, ok := m.children[repo][cur]
		if !ok {
			break
		}
		chain = append(chain, c.parent)
		cur = c.parent
	}
	return chain
}

type handler struct {
	m         *Mirror
	src       Source // fills blobs
	manifests Source // loads manifests
	hop       Source // loads manifests for a hop (the registry alone)
	chained   bool
	stats     *Stats
}

const mediaTypeLabel = "mediaType"

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "read-only mirror", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	if r.URL.Path == "/v2/" || r.URL.Path == "/v2" {
		w.WriteHeader(http.StatusOK)
		return
	}
	repo, kind, ref, ok := parsePath(r.URL.Path)
	if !ok {
		notFound(w, "NAME_UNKNOWN", "not a repository's manifest or blob path")
		return
	}
	d, err := digest.Parse(ref)
	if err != nil {
		// Tags are not served here (digest-only; pinned tags: Tags).
		notFound(w, "MANIFEST_UNKNOWN", fmt.Sprintf("tag %s is not pinned on this node", ref))
		return
	}
	if h.chained {
		chain, ok := parseChain(r.Header.Get(ChainHeader))
		root := d
		if len(chain) > 0 {
			root = chain[len(chain)-1]
		}
		code := "BLOB_UNKNOWN"
		if kind == "manifests" {
			code = "MANIFEST_UNKNOWN"
		}
		switch {
		case !ok:
			notFound(w, code, "the "+ChainHeader+" header is not a list of up to 4 digests")
			return
		case !h.m.pinned(repo, root) && !h.m.allowed(repo, root):
			// Peers pin the same sets, but not at the same instant: the asking node may
			// ask again in a moment (package peers).
			w.Header().Set(NotPinnedHeader, "true")
			notFound(w, code, "not pinned on this node")
			return
		}
		if err := h.m.admit(r.Context(), repo, chain, h.manifestSource(r)); err != nil {
			notFound(w, code, err.Error())
			return
		}
	}
	switch kind {
	case "manifests":
		h.manifest(w, r, repo, d)
	case "blobs":
		h.blob(w, r, repo, d)
	}
}

func (h *handler) manifestSource(r *http.Request) Source {
	if r.Header.Get(HopHeader) != "" || r.Header.Get(StoredOnlyHeader) != "" {
		return h.hop
	}
	return h.manifests
}

func parseChain(v string) ([]digest.Digest, bool) {
	if v == "" {
		return nil, true
	}
	var chain []digest.Digest
	for _, s := range strings.Split(v, ",") {
		d, err := digest.Parse(strings.TrimSpace(s))
		if err != nil || len(chain) == 4 {
			return nil, false
		}
		chain = append(chain, d)
	}
	return chain, true
}

// admit learns what the manifests of chain name, from the pinned one at its end down,
// so the digest below them may be served. It says why not when the chain does not lead
// to a pinned manifest, or a manifest of it cannot be had.
func (m *Mirror) admit(ctx context.Context, repo string, chain []digest.Digest, src Source) error {
	for i := len(chain) - 1; i >= 0; i-- {
		c := chain[i]
		if !m.manifestAllowed(repo, c) {
			return fmt.Errorf("manifest %s of the request's chain is not pinned on this node, nor named by a manifest it serves", c)
		}
		if _, _, err := m.loadManifest(ctx, repo, chain[i+1:], c, src); err != nil {
			return fmt.Errorf("manifest %s of the request's chain cannot be had: %w", c, err)
		}
	}
	return nil
}

// parsePath splits /v2/<name>/(manifests|blobs)/<ref>, the name being a source
// repository in the mirror's path form (PathFor).
func parsePath(p string) (repo, kind, ref string, ok bool) {
	rest, found := strings.CutPrefix(p, "/v2/")
	if !found {
		return "", "", "", false
	}
	for _, k := range []string{"/manifests/", "/blobs/"} {
		if i := strings.LastIndex(rest, k); i > 0 {
			return SourceRepo(rest[:i]), strings.Trim(k, "/"), rest[i+len(k):], true
		}
	}
	return "", "", "", false
}

// PathFor is how a source repository appears in the mirror's paths: a reference's path
// may not hold a port's colon, so "host:port/ns/app" is "host_port/ns/app" (a DNS name
// has no underscore). SourceRepo undoes it.
func PathFor(repo string) string {
	host, rest, _ := strings.Cut(repo, "/")
	return strings.Replace(host, ":", "_", 1) + "/" + rest
}

// SourceRepo is the source repository of a mirror path (PathFor's inverse).
func SourceRepo(path string) string {
	host, rest, _ := strings.Cut(path, "/")
	if i := strings.LastIndex(host, "_"); i > 0 {
		if _, err := strconv.Atoi(host[i+1:]); err == nil {
			host = host[:i] + ":" + host[i+1:]
		}
	}
	return host + "/" + rest
}

// notFound answers 404 with the distribution spec's error body: code, and why in the
// message (the runtime shows it in its pull error): not pinned on this node, not held
// by it, or a fill that failed, with its sources' words.
func notFound(w http.ResponseWriter, code, why string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusNotFound)
	body, _ := json.Marshal(map[string][]map[string]string{"errors": {{"code": code, "message": why}}})
	w.Write(body)
}

// child is what the served manifest naming d of repo says of it, and whether one does.
func (m *Mirror) child(repo string, d digest.Digest) (child, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.children[repo][d]
	return c, ok
}

func (m *Mirror) allowed(repo string, d digest.Digest) bool {
	_, ok := m.child(repo, d)
	return ok
}

// manifestAllowed says whether repo@d may be served as a manifest: a pinned one, or
// one an index served names (never a config or a layer).
func (m *Mirror) manifestAllowed(repo string, d digest.Digest) bool {
	if m.pinned(repo, d) {
		return true
	}
	c, ok := m.child(repo, d)
	return ok && c.manifest
}

// loadManifest is repo@d from the store (checked against d as it is read), else from
// src (checked against d and stored), with the blobs it names now allowed. fromStore
// says where it came from. A stored copy that does not match d is not served: the
// mirror's own is deleted, the runtime's (containerd's) left alone and no longer read
// (corruptInRuntime); either way the manifest is fetched again.
func (m *Mirror) loadManifest(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, src Source) (data []byte, fromStore bool, err error) {
	size := m.manifestSize(repo, d)
	data, err = m.storedManifest(ctx, d, size)
	switch {
	case err == nil:
		fromStore = true
	case errors.Is(err, errCorrupt):
		m.log.WithError(err).WithField("manifest", repo+"@"+d.String()).Warn("mirror: a stored manifest is corrupted on disk")
		data, err = m.fetchManifest(ctx, repo, chain, d, size, src)
	case errors.Is(err, errNotStored):
		data, err = m.fetchManifest(ctx, repo, chain, d, size, src)
	}
	if err != nil {
		return nil, false, err
	}
	m.remember(repo, d, data)
	return data, fromStore, nil
}

// manifestSize is the size the manifest above repo@d gives it (an index naming it),
// -1 when none gives one (a pinned manifest: it is bounded by maxManifest only).
func (m *Mirror) manifestSize(repo string, d digest.Digest) int64 {
	if c, ok := m.child(repo, d); ok && c.manifest {
		return c.size
	}
	return -1
}

// errNotStored is a digest neither the store nor the runtime's content store holds (or
// only a copy found corrupted there). errCorrupt is a stored copy that does not match
// its digest: not served, and fetched again.
var (
	errNotStored = errors.New("not stored")
	errCorrupt   = errors.New("corrupted on disk")
)

// storedManifest is manifest d of size bytes (-1: not known) from the store, else from
// the runtime's content store: read whole (at most maxManifest bytes) and checked
// against d. A copy that does not match is errCorrupt: deleted from the mirror's own
// store, or, in the runtime's, left there and read no more (corruptInRuntime).
func (m *Mirror) storedManifest(ctx context.Context, d digest.Digest, size int64) ([]byte, error) {
	rd, _, own, err := m.storedReader(ctx, d)
	if err != nil {
		return nil, errNotStored
	}
	data, err := io.ReadAll(io.LimitReader(rd, maxManifest+1))
	rd.Close()
	if err != nil {
		return nil, err
	}
	if !Matches(data, d) {
		return nil, m.corrupt(ctx, d, own, "manifest")
	}
	if size >= 0 && int64(len(data)) != size {
		return nil, fmt.Errorf("%s in the store: %d bytes, the index naming it gives %d: %w", d, len(data), size, ErrSize)
	}
	if err := isManifest(data); err != nil {
		return nil, fmt.Errorf("%s in the store: %w", d, err)
	}
	return data, nil
}

// corrupt handles a stored copy of d (a blob or a manifest: what) found not to match
// d, and says so (the caller logs it): the mirror's own copy (own) is deleted; the
// runtime's is left where it is (it is the runtime's, not imagepind's, to delete), and
// from now on neither read nor taken for a copy the mirror's store may drop (Prune).
// The next request fills d again.
func (m *Mirror) corrupt(ctx context.Context, d digest.Digest, own bool, what string) error {
	if own {
		err := fmt.Errorf("the stored %s does not match %s: deleted from the store, filled again: %w", what, d, errCorrupt)
		if derr := m.store.Delete(context.WithoutCancel(ctx), d); derr != nil {
			err = fmt.Errorf("%w (deleting it: %v)", err, derr)
		}
		return err
	}
	m.mu.Lock()
	m.corruptInRuntime[d] = time.Now()
	m.mu.Unlock()
	return fmt.Errorf("the runtime's content store holds a %s that does not match %s: left there, read no more, filled from the peers or the registry into the mirror's store instead (containerd: ctr -n <namespace> content rm %s removes it): %w", what, d, d, errCorrupt)
}

// CorruptInRuntime are the digests whose copy in the runtime's content store (ReadAlso)
// was found not to match: the mirror serves them from its own store, filled from the
// peers or the registry, until the runtime no longer holds that copy.
func (m *Mirror) CorruptInRuntime() []digest.Digest {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]digest.Digest, 0, len(m.corruptInRuntime))
	for d := range m.corruptInRuntime {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

// flightKey is one manifest fetch: a digest from one source. Fetches from different
// sources are never joined: a request answered from the registry alone (a peer's
// hop) never waits on a fetch that asks peers, so no two nodes wait on each other.
// (The registry's own fetches are joined below them: Shared.)
type flightKey struct {
	src any // the Source, or its type when it is not comparable
	d   digest.Digest
}

func sourceKey(src Source) any {
	if reflect.ValueOf(src).Comparable() {
		return src
	}
	return reflect.TypeOf(src)
}

// fetchManifest is repo@d from src, checked against d and stored: one fetch for every
// request asking at once (the runtime, and peers), which does not end with the request
// that started it (flights).
func (m *Mirror) fetchManifest(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64, src Source) ([]byte, error) {
	return m.flights.do(ctx, flightKey{sourceKey(src), d}, func(ctx context.Context) ([]byte, error) {
		return m.fetchAndStore(ctx, repo, chain, d, size, src)
	})
}

func (m *Mirror) fetchAndStore(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64, src Source) ([]byte, error) {
	data, _, err := src.Manifest(ctx, repo, chain, d, size)
	if err != nil {
		return nil, err
	}
	if size >= 0 && int64(len(data)) != size {
		return nil, fmt.Errorf("the source sent %d bytes for %s, the index naming it gives %d: %w", len(data), d, size, ErrSize)
	}
	if !Matches(data, d) {
		return nil, fmt.Errorf("the source sent a manifest that does not match %s", d)
	}
	if err := isManifest(data); err != nil {
		return nil, fmt.Errorf("%s from the source: %w", d, err)
	}
	if sw, err := m.store.Writer(ctx, d, int64(len(data))); err == nil {
		if _, err := sw.Write(data); err == nil {
			_ = sw.Commit(ctx)
		}
		sw.Close()
	}
	return data, nil
}

// maxManifest bounds a manifest read (the distribution spec's limit is 4 MiB).
const maxManifest = 4 << 20

func (h *handler) manifest(w http.ResponseWriter, r *http.Request, repo string, d digest.Digest) {
	m := h.m
	if !m.manifestAllowed(repo, d) {
		// A config or layer is not served as a manifest (it would be cut at maxManifest,
		// under a digest the body does not match).
		notFound(w, "MANIFEST_UNKNOWN", "not a manifest pinned on this node, nor named by a manifest it serves")
		return
	}
	data, fromStore, err := m.loadManifest(r.Context(), repo, m.Chain(repo, d), d, h.manifestSource(r))
	if err != nil {
		// Not available, or a source serving other bytes: the client goes on to its
		// next endpoint.
		m.log.WithError(err).WithField("manifest", repo+"@"+d.String()).Info("mirror: manifest not available")
		notFound(w, "MANIFEST_UNKNOWN", fmt.Sprintf("pinned on this node, but not stored and cannot be fetched: %v", err))
		return
	}
	if fromStore {
		h.stats.FromStore.Add(int64(len(data)))
	} else {
		h.stats.Transferred.Add(int64(len(data)))
	}
	w.Header().Set("Content-Type", sniffMediaType(data))
	w.Header().Set("Docker-Content-Digest", d.String())
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		w.Write(data)
	}
}

// remember allows the blobs (or child manifests) a manifest names.
func (m *Mirror) remember(repo string, d digest.Digest, data []byte) {
	blobs, manifests, ok := named(data)
	if !ok {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.children[repo]
	if c == nil {
		c = map[digest.Digest]child{}
		m.children[repo] = c
	}
	for _, b := range blobs {
		c[b.digest] = child{parent: d, size: b.size}
	}
	for _, b := range manifests {
		c[b.digest] = child{parent: d, size: b.size, manifest: true}
	}
}

// descriptor is a digest a manifest names, with the size it gives (-1: none).
type descriptor struct {
	digest digest.Digest
	size   int64
}

// named is what a manifest names: the config and layers of an image manifest, the
// manifests of an index; ok false when data is not a manifest (a layer, a config).
func named(data []byte) (blobs, manifests []descriptor, ok bool) {
	type desc struct {
		Digest digest.Digest `json:"digest"`
		Size   *int64        `json:"size"`
	}
	var man struct {
		Config    *desc  `json:"config"`
		Layers    []desc `json:"layers"`
		Manifests []desc `json:"manifests"`
	}
	if json.Unmarshal(data, &man) != nil {
		return nil, nil, false
	}
	of := func(x desc) descriptor {
		if x.Size == nil || *x.Size < 0 {
			return descriptor{x.Digest, -1}
		}
		return descriptor{x.Digest, *x.Size}
	}
	if man.Config != nil {
		blobs = append(blobs, of(*man.Config))
	}
	for _, l := range man.Layers {
		blobs = append(blobs, of(l))
	}
	for _, l := range man.Manifests {
		manifests = append(manifests, of(l))
	}
	return blobs, manifests, true
}

// manifestTypes are the media types served as manifests.
var manifestTypes = map[string]bool{
	"application/vnd.oci.image.manifest.v1+json":                true,
	"application/vnd.oci.image.index.v1+json":                   true,
	"application/vnd.docker.distribution.manifest.v2+json":      true,
	"application/vnd.docker.distribution.manifest.list.v2+json": true,
	"application/vnd.docker.distribution.manifest.v1+json":      true,
	"application/vnd.docker.distribution.manifest.v1+prettyjws": true,
}

// ErrNotManifest is data that is no manifest (a config, a layer) asked for as one.
var ErrNotManifest = errors.New("not a manifest")

// isManifest says whether data is a manifest: JSON of at most maxManifest bytes with a
// manifest media type, or without one, the shape of one (an image manifest's config
// and layers, an index's manifests, a schema 1 manifest's fsLayers).
func isManifest(data []byte) error {
	if len(data) > maxManifest {
		return fmt.Errorf("more than %d bytes: %w", maxManifest, ErrNotManifest)
	}
	var v struct {
		MediaType string          `json:"mediaType"`
		Config    json.RawMessage `json:"config"`
		Layers    json.RawMessage `json:"layers"`
		Manifests json.RawMessage `json:"manifests"`
		FSLayers  json.RawMessage `json:"fsLayers"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return fmt.Errorf("%w: %v", ErrNotManifest, err)
	}
	switch {
	case v.MediaType != "" && !manifestTypes[v.MediaType]:
		return fmt.Errorf("media type %s: %w", v.MediaType, ErrNotManifest)
	case v.MediaType == "" && (v.Config == nil || v.Layers == nil) && v.Manifests == nil && v.FSLayers == nil:
		return ErrNotManifest
	}
	return nil
}

// sniffMediaType is a manifest's mediaType field, else the OCI type its shape says.
func sniffMediaType(data []byte) string {
	var v struct {
		MediaType string          `json:"mediaType"`
		Manifests json.RawMessage `json:"manifests"`
	}
	_ = json.Unmarshal(data, &v)
	switch {
	case v.MediaType != "":
		return v.MediaType
	case v.Manifests != nil:
		return "application/vnd.oci.image.index.v1+json"
	}
	return "application/vnd.oci.image.manifest.v1+json"
}

func (h *handler) blob(w http.ResponseWriter, r *http.Request, repo string, d digest.Digest) {
	m := h.m
	c, ok := m.child(repo, d)
	if !ok {
		notFound(w, "BLOB_UNKNOWN", "not a blob of an image pinned on this node (no manifest it served names it)")
		return
	}
	ctx := r.Context()
	counter := &h.stats.Transferred
	body, size, err := m.stored(ctx, d)
	switch {
	case err == nil:
		counter = &h.stats.FromStore
		w.Header().Set(StoredHeader, "1")
	case r.Method == http.MethodHead || (h.chained && r.Header.Get(StoredOnlyHeader) != ""):
		// Pulls GET their blobs; a HEAD for one not stored yet is not worth a fetch. A
		// peer asking for what is stored only may be waited on by this node's fill.
		notFound(w, "BLOB_UNKNOWN", "pinned on this node, but not stored on it yet")
		return
	case c.size < 0:
		// Nothing would bound the fill: a source could write the store full.
		m.log.WithField("blob", repo+"@"+d.String()).Warn("mirror: the manifest naming the blob gives no size; not fetched")
		notFound(w, "BLOB_UNKNOWN", "pinned on this node, but not stored, and the manifest naming it gives no size, so it is not fetched")
		return
	default:
		body, size, err = m.open(ctx, repo, m.Chain(repo, d), d, c.size, h.src)
		if err != nil {
			m.log.WithError(err).WithField("blob", repo+"@"+d.String()).Info("mirror: blob not available")
			notFound(w, "BLOB_UNKNOWN", fmt.Sprintf("pinned on this node, but not stored and cannot be fetched: %v", err))
			return
		}
	}
	defer body.Close()
	if err := serveBlob(w, r, d, body, size, counter); err != nil {
		m.log.WithError(err).WithField("blob", repo+"@"+d.String()).Warn("mirror: blob not served whole; the client's copy is cut")
		panic(http.ErrAbortHandler)
	}
}

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n.Add(int64(n))
	return n, err
}
