package peers

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	goruntime "runtime"
	"slices"
	"sync/atomic"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/internal/sockowner"
	"github.com/imagepin/imagepin/mirror"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/status"
)

// Config is the node-local mirror and its sharing with other nodes, as a node runs
// them ([peers], turned into this by the composition root).
type Config struct {
	// MirrorAddress is the node-local mirror's host:port (loopback) the runtime pulls
	// through.
	MirrorAddress string
	// Address is this node's address as its peers reach it; empty: this node shares
	// nothing (its own mirror only).
	Address string
	// Nodes are the peers given in the config (the aggregator hands out more).
	Nodes []string
	// Cert is the serving certificate and CertKey its key ("": in Cert, one PEM),
	// ClientCA what signs the peers' client certificates.
	Cert, CertKey, ClientCA string
	// ClientCert is the certificate presented to peers and ClientKey its key ("": in
	// ClientCert), CA what signs their serving certificates.
	ClientCert, ClientKey, CA string
	// MaxServing bounds the requests served to peers at once; ServeBytesPerSecond the
	// bandwidth to them, all together (0: no limit).
	MaxServing          int
	ServeBytesPerSecond int64
	// Fanout is how many children a node has in each blob's tree (Source.Fanout; 0:
	// DefaultFanout).
	Fanout int
	// SeedsDir holds the records of seeds (package seed): the store's prune keeps what
	// they name. "": no seeds.
	SeedsDir string
	// Platform is the node's (the zero value: this process's, GOOS/GOARCH): of an
	// index, the node keeps the instance its runtime pulls (Run).
	Platform registry.Platform
}

// Node is a node's mirror at run time: what it may serve (the pinned references, told
// by Pinner), its peers (Config.Nodes and FromAggregator), the pruning of its store
// (Run), the loopback listener for the runtime and the HTTPS server for the peers
// (Serve, ServePeers), and the bytes counted on the way (Served, Bytes, Stamp).
type Node struct {
	// Served are the bytes the local mirror served the runtime; Bytes those from the
	// registry, from peers and to peers.
	Served mirror.Stats
	Bytes  Stats

	cfg    Config
	mirror *mirror.Mirror
	store  *blobstore.Store
	log    logrus.FieldLogger
	// local serves the runtime; set by Bind.
	local http.Handler
	// server and serverTLS serve the peers (nil: this node shares nothing).
	server    *Server
	serverTLS *tls.Config
	// aggregated are the peers the aggregator handed out last; onPeers is called when
	// it names a node it did not before (OnPeers).
	aggregated atomic.Pointer[[]string]
	onPeers    atomic.Pointer[func()]
	// pinned are the references the mirror may serve (keys: repo@digest).
	pinned atomic.Pointer[map[string]bool]
	// prune wakes the store's pruning after the pinned references changed; filled after
	// a blob a fill committed, when the runtime keeps its own copy (Runtime.Content).
	prune  chan struct{}
	filled chan struct{}
	// keep puts in the store the blobs of pinned images the node holds nowhere (Run).
	keep *keeper
	// allow says which users' connections the loopback mirror answers (Serve).
	allow func(uid int) bool
	// held is what the node holds of its pinned images, read off the agent's loop (Run).
	held *heldCache
	// holdings says which blobs of a pinned image the store holds, for the node's held
	// summary: held, unless SetHoldings says otherwise.
	holdings atomic.Pointer[Holdings]
}

// Holdings says which blobs of a pinned image (repo@sha256:…) the node's store holds
// and serves to peers: its manifests, config and layers, each Held or not.
type Holdings interface {
	ImageBlobs(image string) (blobs []status.Blob, why string)
}

// SetHoldings makes the node's held summary (HeldPath) name, besides its seeds, every
// blob h says the store holds of the images the node pins, in place of the node's own
// reading of its stores (ImageBlobs; a test's). A no-op on a nil Node.
func (n *Node) SetHoldings(h Holdings) {
	if n != nil {
		n.holdings.Store(&h)
	}
}

// heldDigests are the digests the store holds of the pinned images (SetHoldings).
func (n *Node) heldDigests(context.Context) ([]digest.Digest, error) {
	h := n.holdings.Load()
	if h == nil {
		return nil, nil
	}
	var out []digest.Digest
	for ref := range *n.pinned.Load() {
		blobs, _ := (*h).ImageBlobs(ref)
		for _, b := range blobs {
			if d, err := digest.Parse(b.Digest); err == nil && b.Held {
				out = append(out, d)
			}
		}
	}
	return out, nil
}

// New builds the node's mirror over store, serving nothing until Pinner's writes tell
// it what is pinned; Bind completes it once the runtime is known.
func New(cfg Config, store *blobstore.Store, log logrus.FieldLogger) *Node {
	cfg.Nodes = slices.Clone(cfg.Nodes)
	n := &Node{cfg: cfg, store: store, log: log, prune: make(chan struct{}, 1), allow: sockowner.RootOrSelf}
	empty := map[string]bool{}
	n.pinned.Store(&empty)
	n.mirror = mirror.New(store, n.isPinned, log.WithField("part", "mirror"))
	platform := cfg.Platform
	if platform.OS == "" {
		platform = registry.Platform{OS: goruntime.GOOS, Architecture: goruntime.GOARCH}
	}
	n.keep = &keeper{mirror: n.mirror, pinned: n.pinnedRefs, isPinned: n.isPinned, wake: make(chan struct{}, 1),
		pruneNow: n.wakePrune, log: log.WithField("part", "keep")}
	n.keep.instance = func(index []byte) (digest.Digest, error) { return registry.Instance(index, platform) }
	n.held = newHeldCache()
	n.keep.passed = n.held.woken
	n.SetHoldings(n)
	return n
}

// Store is the node's blob store; nil on a nil Node ([peers] off).
func (n *Node) Store() *blobstore.Store {
	if n == nil {
		return nil
	}
	return n.store
}

// Runtime is what the mirror needs of the node's runtime.
type Runtime struct {
	// Registry is the registries as the runtime reaches them, without the node-local
	// mirror itself (it would ask itself).
	Registry mirror.Source
	// Content is the runtime's own content store (containerd), served from when the
	// mirror's store lacks a blob; what it holds leaves the mirror's store. Nil on
	// CRI-O, which keeps no compressed blobs.
	Content mirror.Content
}

// Bind sets the mirror's sources: the runtime's content store, the peers (when
// sharing: they are asked before the registry, and served, filling a blob from the
// nodes above this one in its tree), the registry. Broken or missing certificates leave the node-local mirror
// alone, logged. Call it once, before serving.
func (n *Node) Bind(rt Runtime) {
	if rt.Content != nil {
		n.mirror.ReadAlso(rt.Content)
		n.filled = make(chan struct{}, 1)
		n.mirror.OnFilled(func() {
			select {
			case n.filled <- struct{}{}:
			default:
			}
		})
	}
	reg := CountRegistry(rt.Registry, &n.Bytes)
	n.local = n.mirror.Handler(reg, &n.Served)
	n.keep.src = reg
	if n.cfg.Address == "" {
		return
	}
	if err := n.share(reg); err != nil {
		// The certificates missing or broken: the node keeps its own mirror and
		// pulls from the registry, as without peers.
		n.log.WithError(err).Error("[peers] sharing with other nodes is off until imagepind restarts with this fixed; the node-local mirror works")
	}
}

// share sets up the peers: the mirror fills from them before the registry, and serves
// them (filling a blob from the nodes above this one in its tree, then the registry).
func (n *Node) share(reg mirror.Source) error {
	client, err := Client(n.cfg.ClientCert, n.cfg.ClientKey, n.cfg.CA)
	if err != nil {
		return err
	}
	serverTLS, err := ServerTLS(n.cfg.Cert, n.cfg.CertKey, n.cfg.ClientCA)
	if err != nil {
		return err
	}
	log := n.log.WithField("part", "peers")
	src := NewSource(n.cfg.Address, n.nodes, reg, client, &n.Bytes, log)
	src.Fanout = n.cfg.Fanout
	n.local = n.mirror.Handler(src, &n.Served)
	n.keep.src = src
	n.server = &Server{Mirror: n.mirror.PeerHandler(reg, src, &mirror.Stats{}), SeedsDir: n.cfg.SeedsDir, Held: n.heldDigests,
		MaxServing: n.cfg.MaxServing, BytesPerSecond: n.cfg.ServeBytesPerSecond, Stats: &n.Bytes, Log: log}
	n.serverTLS = serverTLS
	log.WithField("address", n.cfg.Address).WithField("peers", len(n.cfg.Nodes)).Info("[peers] sharing pinned images with other nodes")
	return nil
}

// nodes are the peers now: the static list and the aggregator's.
func (n *Node) nodes() []string {
	out := n.cfg.Nodes
	if a := n.aggregated.Load(); a != nil {
		out = slices.Clone(out)
		for _, x := range *a {
			if !slices.Contains(out, x) {
				out = append(out, x)
			}
		}
	}
	return out
}

// FromAggregator takes the peers a report's answer carries (the nodes that pin the
// same sets); a no-op on a nil Node and when this node shares nothing.
func (n *Node) FromAggregator(nodes []string) {
	if n == nil || n.server == nil {
		return
	}
	old := n.aggregated.Swap(&nodes)
	if old == nil || !slices.Equal(*old, nodes) {
		n.log.WithField("peers", len(nodes)).Info("[peers] peers from the aggregator")
	}
	for _, x := range nodes {
		if old == nil || !slices.Contains(*old, x) {
			if f := n.onPeers.Load(); f != nil {
				(*f)()
			}
			return
		}
	}
}

// OnPeers makes f be called each time the aggregator names a peer it did not name
// before (a joining node learns its peers from its first reports; its pulls that failed
// without them can be tried again at once). A no-op on a nil Node.
func (n *Node) OnPeers(f func()) {
	if n == nil {
		return
	}
	n.onPeers.Store(&f)
}

// Stamp adds the peers' byte counts and the store's size to each status before publish
// takes it (the seeds are the agent's: seed.Report, part of what it compares).
func (n *Node) Stamp(publish func(status.Node)) func(status.Node) {
	return func(s status.Node) {
		stored, _ := n.store.Usage(context.Background())
		var address string
		if n.server != nil {
			address = n.cfg.Address
		}
		s.Node.Peers = &status.PeerBytes{Address: address, FromRegistry: n.Bytes.FromRegistry.Load(), FromPeers: n.Bytes.FromPeers.Load(),
			ToPeers: n.Bytes.ToPeers.Load(), Stored: stored}
		if bad := n.mirror.CorruptInRuntime(); len(bad) > 0 {
			s.Faults = append(s.Faults, fmt.Sprintf("the runtime's content store holds %d blob(s) that do not match their digest (corrupted on disk; first %s): the node-local mirror serves them from its own store, filled from the peers or the registry; remove them there (containerd: ctr -n <namespace> content rm <digest>)", len(bad), bad[0]))
		}
		publish(s)
	}
}
