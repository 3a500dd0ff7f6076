package wire

import (
	"context"
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/crio"
	"github.com/imagepin/imagepin/internal/httpserve"
	"github.com/imagepin/imagepin/mirror"
	"github.com/imagepin/imagepin/peers"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/status"
)

// Peers is the node-local mirror of pinned images and the sharing of their blobs with
// other nodes ([peers]): the store, the mirror, what it may serve (kept up to date by
// the pinner), and the server its peers read.
type Peers struct {
	Mirror  *mirror.Mirror
	Address string
	// Served are the bytes the local mirror served the runtime; Bytes those from the
	// registry, from peers and to peers.
	Served mirror.Stats
	Bytes  peers.Stats
	local  http.Handler
	store  *blobstore.Store
	// server and serverTLS serve the peers (nil: this node shares nothing).
	server    *peers.Server
	serverTLS *tls.Config
	peerAddr  string
	// nodes are the peers: [peers] nodes, with those the aggregator hands out.
	static     []string
	aggregated atomic.Pointer[[]string]
	// admin are the administrator's registries files, copied without ours into
	// admin.Scratch: what the mirror's and the disk check's registry access read.
	admin  *crio.AdminFiles
	pinned atomic.Pointer[map[string]bool]
	log    logrus.FieldLogger
	// prune wakes the store's pruning after the pinned references changed.
	prune chan struct{}
}

// NewPeers opens the blob store and builds the mirror; nil when [peers] is off, after
// removing a mirror drop-in an earlier run left (the mirror being gone makes CRI-O go on
// to the next endpoint anyway; the next reload drops the entries).
func NewPeers(cfg conf.Config, stateDir string, log logrus.FieldLogger) (*Peers, error) {
	dropIn := filepath.Join(cfg.Disk.RegistriesConfDir, crio.MirrorDropInName)
	dir := cfg.Peers.StoreDir
	if dir == "" {
		dir = filepath.Join(stateDir, "blobs")
	}
	if !cfg.Peers.Enabled {
		if err := os.Remove(dropIn); err == nil {
			log.WithField("file", dropIn).Info("[peers] is off: removed the node-local mirror's registries drop-in")
		}
		if _, err := os.Stat(dir); err == nil {
			if err := os.RemoveAll(dir); err == nil {
				log.WithField("dir", dir).Info("[peers] is off: removed the node-local mirror's blob store")
			}
		}
		return nil, nil
	}
	store, err := blobstore.Open(dir)
	if err != nil {
		return nil, err
	}
	p := &Peers{Address: cfg.Peers.MirrorAddress, log: log, prune: make(chan struct{}, 1),
		admin: &crio.AdminFiles{Main: cfg.Disk.RegistriesConf, Dir: cfg.Disk.RegistriesConfDir, Scratch: filepath.Join(stateDir, "registries-admin.d")}}
	empty := map[string]bool{}
	p.pinned.Store(&empty)
	// The mirror's own way to the registries: the administrator's files without its
	// drop-in (copied into Scratch, kept up to date at every pin write), or it would
	// ask itself.
	if _, _, err := p.admin.Read(); err != nil {
		log.WithError(err).Warn("[peers] reading the administrator's registries files")
	}
	rc, _ := RegistryAccess(cfg, conf.RuntimeCRIO, stateDir)
	rc.RegistriesConfDir = p.admin.Scratch
	keyring := &cri.KeyringFile{Path: cfg.CRI.PullSecret}
	reg := peers.CountRegistry(mirror.FromRegistry(registry.New(rc, keyring.Lookup)), &p.Bytes)
	p.store = store
	p.Mirror = mirror.New(store, p.isPinned, log.WithField("part", "mirror"))
	p.local = p.Mirror.Handler(reg, &p.Served)
	if cfg.Peers.Sharing() {
		if err := p.share(cfg, reg); err != nil {
			// The certificates missing or broken: the node keeps its own mirror and
			// pulls from the registry, as without peers.
			log.WithError(err).Error("[peers] sharing with other nodes is off until imagepind restarts with this fixed; the node-local mirror works")
		}
	}
	return p, nil
}

// share sets up the peers: the mirror fills from them before the registry, and serves
// them (filling from the registry only).
func (p *Peers) share(cfg conf.Config, reg mirror.Source) error {
	clientCert := cfg.Peers.ClientCert
	if clientCert == "" {
		clientCert = cfg.Report.Cert
	}
	client, err := peers.Client(clientCert, cfg.Peers.CA)
	if err != nil {
		return err
	}
	serverTLS, err := peers.ServerTLS(cfg.Peers.Cert, cfg.Peers.ClientCA)
	if err != nil {
		return err
	}
	p.static = slices.Clone(cfg.Peers.Nodes)
	log := p.log.WithField("part", "peers")
	src := peers.NewSource(cfg.Peers.Address, p.nodes, reg, client, &p.Bytes, log)
	p.local = p.Mirror.Handler(src, &p.Served)
	p.server = &peers.Server{Mirror: p.Mirror.PeerHandler(reg, src.Forwarding(), &mirror.Stats{}), MaxServing: cfg.Peers.MaxServing,
		BytesPerSecond: int64(cfg.Peers.ServeMiBPerSecond) << 20, Stats: &p.Bytes, Log: log}
	p.serverTLS, p.peerAddr = serverTLS, cfg.Peers.Address
	log.WithField("address", p.peerAddr).WithField("peers", len(p.static)).Info("[peers] sharing pinned images with other nodes")
	return nil
}

// nodes are the peers now: the static list and the aggregator's.
func (p *Peers) nodes() []string {
	out := p.static
	if a := p.aggregated.Load(); a != nil {
		out = slices.Clone(out)
		for _, n := range *a {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	return out
}

// FromAggregator takes the peers a report's answer carries (the nodes that pin the
// same sets); a no-op when this node shares nothing.
func (p *Peers) FromAggregator(nodes []string) {
	if p == nil || p.server == nil {
		return
	}
	old := p.aggregated.Swap(&nodes)
	if old == nil || !slices.Equal(*old, nodes) {
		p.log.WithField("peers", len(nodes)).Info("[peers] peers from the aggregator")
	}
}

// Stamp adds the peers' byte counts to each status before publish takes it.
func (p *Peers) Stamp(publish func(status.Node)) func(status.Node) {
	return func(n status.Node) {
		stored, _ := p.store.Usage(context.Background())
		n.Node.Peers = &status.PeerBytes{Address: p.peerAddr, FromRegistry: p.Bytes.FromRegistry.Load(), FromPeers: p.Bytes.FromPeers.Load(),
			ToPeers: p.Bytes.ToPeers.Load(), Stored: stored}
		publish(n)
	}
}

func (p *Peers) isPinned(repo string, d digest.Digest) bool {
	return (*p.pinned.Load())[repo+"@"+d.String()]
}

// setPinned takes the pinned references (the pinner's patterns).
func (p *Peers) setPinned(refs []string) {
	m := map[string]bool{}
	for _, r := range refs {
		if !strings.Contains(r, "*") {
			m[r] = true
		}
	}
	old := p.pinned.Swap(&m)
	if len(*old) != len(m) || !sameKeys(*old, m) {
		select {
		case p.prune <- struct{}{}:
		default:
		}
	}
}

func sameKeys(a, b map[string]bool) bool {
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return len(a) == len(b)
}

// pruneLoop drops the blobs no pinned reference needs, after each change of the pins
// (an image stays pinned for unpin_delay after its set goes: so do its blobs).
func (p *Peers) pruneLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.prune:
		}
		var refs []string
		for r := range *p.pinned.Load() {
			refs = append(refs, r)
		}
		n, freed, err := p.Mirror.Prune(ctx, refs)
		switch {
		case err != nil:
			p.log.WithError(err).Warn("mirror store: prune")
		case n > 0:
			p.log.WithField("blobs", n).WithField("bytes", freed).Info("mirror store: released the blobs of images no longer pinned")
		}
	}
}

// Serve runs the mirror, the store's pruning and the peers' server until ctx ends. The
// peers' server failing (its address taken) leaves the node-local mirror running.
func (p *Peers) Serve(ctx context.Context) error {
	go p.pruneLoop(ctx)
	if p.server != nil {
		go func() {
			if err := p.server.Serve(ctx, p.peerAddr, p.serverTLS); err != nil {
				p.log.WithError(err).Error("[peers] serving peers stopped; the node-local mirror works")
			}
		}()
	}
	return httpserve.Run(ctx, p.Address, p.local)
}
