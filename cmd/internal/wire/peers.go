package wire

import (
	"context"
	"os"
	"path/filepath"
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
	"github.com/imagepin/imagepin/registry"
)

// Peers is the node-local mirror of pinned images ([peers], issue 24 in progress): its
// store, the mirror, and what it may serve, kept up to date by the pinner.
type Peers struct {
	Mirror  *mirror.Mirror
	Address string
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
	source := registry.New(rc, keyring.Lookup)
	p.Mirror = mirror.New(store, source, p.isPinned, log.WithField("part", "mirror"))
	return p, nil
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

// Serve runs the mirror (and the store's pruning) until ctx ends.
func (p *Peers) Serve(ctx context.Context) error {
	go p.pruneLoop(ctx)
	return httpserve.Run(ctx, p.Address, p.Mirror)
}
