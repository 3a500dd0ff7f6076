package wire

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/containerd"
	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/crio"
	"github.com/imagepin/imagepin/internal/httpserve"
	"github.com/imagepin/imagepin/internal/sockowner"
	"github.com/imagepin/imagepin/mirror"
	"github.com/imagepin/imagepin/peers"
	"github.com/imagepin/imagepin/pin"
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
	Served   mirror.Stats
	Bytes    peers.Stats
	local    http.Handler
	store    *blobstore.Store
	stateDir string
	runtime  string
	// server and serverTLS serve the peers (nil: this node shares nothing).
	server    *peers.Server
	serverTLS *tls.Config
	peerAddr  string
	// nodes are the peers: [peers] nodes, with those the aggregator hands out.
	static     []string
	aggregated atomic.Pointer[[]string]
	// admin are the administrator's registries files (CRI-O), copied without ours into
	// admin.Scratch: what the mirror's own registry access reads.
	admin  *crio.AdminFiles
	pinned atomic.Pointer[map[string]bool]
	log    logrus.FieldLogger
	// prune wakes the store's pruning after the pinned references changed.
	prune chan struct{}
}

// NewPeers opens the blob store and builds the mirror; nil when [peers] is off, after
// removing what an earlier run left: CRI-O's registries drop-in, the mirror's blocks in
// containerd's hosts.toml files, the store (the mirror being gone makes the runtime go
// on to the next endpoint anyway). Bind completes it once the runtime is known.
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
		hosts := &containerd.MirrorPinner{Record: hostsRecord(stateDir), ConfigPath: cfg.Containerd.ConfigPath}
		if _, err := os.Stat(hosts.Record); err == nil {
			if err := hosts.SyncHosts(nil); err != nil {
				log.WithError(err).Warn("[peers] is off: removing the node-local mirror from containerd's hosts.toml files")
			} else {
				log.Info("[peers] is off: removed the node-local mirror from containerd's hosts.toml files")
			}
		}
		// Only a store imagepind made, and only what it holds: store_dir may name any
		// directory.
		if _, err := os.Stat(dir); err == nil {
			switch err := blobstore.Remove(dir); {
			case err == nil:
				log.WithField("dir", dir).Info("[peers] is off: removed the node-local mirror's blob store")
			case errors.Is(err, blobstore.ErrNotAStore):
				log.WithField("dir", dir).Debug("[peers] is off: store_dir holds no blob store imagepind made; left as it is")
			default:
				log.WithError(err).WithField("dir", dir).Warn("[peers] is off: removing the node-local mirror's blob store")
			}
		}
		return nil, nil
	}
	store, err := blobstore.Open(dir)
	if err != nil {
		return nil, err
	}
	p := &Peers{Address: cfg.Peers.MirrorAddress, log: log, prune: make(chan struct{}, 1), store: store, stateDir: stateDir}
	empty := map[string]bool{}
	p.pinned.Store(&empty)
	p.Mirror = mirror.New(store, p.isPinned, log.WithField("part", "mirror"))
	return p, nil
}

func hostsRecord(stateDir string) string {
	return filepath.Join(stateDir, "containerd-mirror-hosts.json")
}

// Bind sets the mirror's way to the registries for the node's runtime, and the peers.
// The mirror's own registry access never goes through the mirror (it would ask
// itself): on CRI-O the administrator's registries files without its drop-in (copied
// into a scratch directory, kept up to date at every pin write); on containerd the
// hosts.toml files read without the mirror's host. On containerd the mirror also
// serves containerd's own content store.
func (p *Peers) Bind(cfg conf.Config, runtimeName string) error {
	rc, _ := RegistryAccess(cfg, runtimeName, p.stateDir)
	if runtimeName == conf.RuntimeContainerd {
		hosts := &containerd.Hosts{ConfigPath: cfg.Containerd.ConfigPath, Dir: filepath.Join(p.stateDir, "containerd-hosts-mirror"), Skip: p.Address}
		rc.RegistryFiles = hosts.Files
		content, err := containerd.DialContent(cfg.ContainerdSocket(), cfg.Containerd.Namespace)
		if err != nil {
			return err
		}
		p.Mirror.ReadAlso(content)
		p.runtime = conf.RuntimeContainerd
	} else {
		p.admin = &crio.AdminFiles{Main: cfg.Disk.RegistriesConf, Dir: cfg.Disk.RegistriesConfDir, Scratch: filepath.Join(p.stateDir, "registries-admin.d")}
		if _, _, err := p.admin.Read(); err != nil {
			p.log.WithError(err).Warn("[peers] reading the administrator's registries files")
		}
		rc.RegistriesConfDir = p.admin.Scratch
	}
	keyring := &cri.KeyringFile{Path: cfg.CRI.PullSecret}
	reg := peers.CountRegistry(mirror.FromRegistry(registry.New(rc, keyring.Lookup)), &p.Bytes)
	p.local = p.Mirror.Handler(reg, &p.Served)
	if cfg.Peers.Sharing() {
		if err := p.share(cfg, reg); err != nil {
			// The certificates missing or broken: the node keeps its own mirror and
			// pulls from the registry, as without peers.
			p.log.WithError(err).Error("[peers] sharing with other nodes is off until imagepind restarts with this fixed; the node-local mirror works")
		}
	}
	return nil
}

// Pinner wraps the runtime's pinner so that each pin write also points the runtime at
// the mirror: CRI-O's registries drop-in, containerd's hosts.toml files.
func (p *Peers) Pinner(cfg conf.Config, pinner pin.Pinner) pin.Pinner {
	switch pp := pinner.(type) {
	case *crio.Pinner:
		return &crio.MirrorPinner{Pinner: pp, Local: p.Address, Admin: p.admin, OnPins: p.setPinned, Path: mirror.PathFor}
	case *containerd.Pinner:
		return &containerd.MirrorPinner{Pinner: pp, Local: p.Address, ConfigPath: cfg.Containerd.ConfigPath,
			Record: hostsRecord(p.stateDir), Path: mirror.PathFor, OnPins: p.setPinned}
	}
	return pinner
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
	// On containerd, what its content store holds leaves the mirror's store once the
	// runtime has it (no second copy): look 5 s after the last blob filled, and every
	// minute.
	var tick, settled <-chan time.Time
	var filled chan struct{}
	if p.runtime == conf.RuntimeContainerd {
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		tick = t.C
		filled = make(chan struct{}, 1)
		p.Mirror.OnFilled(func() {
			select {
			case filled <- struct{}{}:
			default:
			}
		})
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-filled:
			settled = time.After(5 * time.Second)
			continue
		case <-settled:
			settled = nil
		case <-p.prune:
		case <-tick:
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
			p.log.WithField("blobs", n).WithField("bytes", freed).Info("mirror store: released the blobs of images no longer pinned, or held by the runtime's own content store")
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
	l, err := net.Listen("tcp", p.Address)
	if err != nil {
		return err
	}
	// The mirror serves private images (fetched with the node's pull secret): on
	// loopback only root (the runtime) and imagepind itself may read them.
	if ap, err := netip.ParseAddrPort(l.Addr().String()); err == nil && ap.Addr().IsLoopback() {
		l = &sockowner.Listener{Listener: l, Allow: sockowner.RootOrSelf, Log: p.log}
	}
	return httpserve.Serve(ctx, l, p.local)
}
