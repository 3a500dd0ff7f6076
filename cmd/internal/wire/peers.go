package wire

import (
	"path/filepath"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/containerd"
	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/crio"
	"github.com/imagepin/imagepin/mirror"
	"github.com/imagepin/imagepin/original"
	"github.com/imagepin/imagepin/peers"
	"github.com/imagepin/imagepin/pin"
	"github.com/imagepin/imagepin/pullcreds"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/seed"
	"github.com/imagepin/imagepin/tags/endpoint"
)

// NewPeers opens the blob store and builds the node-local mirror of [peers]
// (peers.Node); nil when [peers] is off, after removing what an earlier run left
// (peers.Off, given what the config names: peersLeftovers). BindPeers completes it once
// the runtime is known.
func NewPeers(cfg conf.Config, stateDir string, log logrus.FieldLogger) (*peers.Node, error) {
	if !cfg.Peers.Enabled {
		peers.Off(peersLeftovers(cfg, stateDir), log)
		return nil, nil
	}
	store, err := blobstore.Open(StoreDir(cfg, stateDir))
	if err != nil {
		return nil, err
	}
	pc := PeersConfig(cfg)
	pc.SeedsDir = seed.Dir(stateDir)
	return peers.New(pc, store, log), nil
}

// StoreDir is the blob store's directory: [peers] store_dir, else <state_dir>/blobs.
func StoreDir(cfg conf.Config, stateDir string) string {
	if cfg.Peers.StoreDir != "" {
		return cfg.Peers.StoreDir
	}
	return filepath.Join(stateDir, "blobs")
}

// PeersConfig is [peers] as peers.Node takes it: sharing only with an address
// (Sharing), the client certificate and its key defaulting to [report]'s.
func PeersConfig(cfg conf.Config) peers.Config {
	p := cfg.Peers
	out := peers.Config{MirrorAddress: p.MirrorAddress}
	if !p.Sharing() {
		return out
	}
	clientCert, clientKey := p.ClientCert, p.ClientKey
	if clientCert == "" {
		clientCert, clientKey = cfg.Report.Cert, cfg.Report.Key
	}
	out.Address, out.Nodes = p.Address, p.Nodes
	out.Cert, out.CertKey, out.ClientCA = p.Cert, p.Key, p.ClientCA
	out.ClientCert, out.ClientKey, out.CA = clientCert, clientKey, p.CA
	out.MaxServing, out.ServeBytesPerSecond = p.MaxServing, int64(p.ServeMiBPerSecond)<<20
	out.Fanout = p.Fanout
	return out
}

// peersLeftovers are what the node-local mirror leaves with [peers] on, where the
// config puts them: the store; CRI-O's registries drop-in and containerd's hosts.toml
// blocks (either runtime's: the runtime is not known yet); the tag endpoint's CA in
// CRI-O's certs.d, for tag_address.
func peersLeftovers(cfg conf.Config, stateDir string) peers.Leftovers {
	l := peers.Leftovers{
		Store: StoreDir(cfg, stateDir),
		Files: []peers.Files{
			&crio.MirrorRegistries{Admin: &crio.AdminFiles{Dir: cfg.Disk.RegistriesConfDir}},
			&containerd.MirrorHosts{Record: hostsRecord(stateDir), ConfigPath: cfg.Containerd.ConfigPath},
		},
	}
	if addr := cfg.Peers.TagAddress; addr != "" {
		l.Untrust = func() error { return endpoint.Forget(stateDir, cfg.Disk.CertsDir, addr) }
	}
	return l
}

func hostsRecord(stateDir string) string {
	return filepath.Join(stateDir, "containerd-mirror-hosts.json")
}

// adminRegistriesDir is where imagepind keeps CRI-O's registries.conf.d as the
// administrator wrote it, without the node-local mirror's drop-in
// (crio.AdminFiles.Scratch): the registry access of what must never ask the mirror on
// CRI-O (the mirror's own fills, the tag check).
func adminRegistriesDir(stateDir string) string {
	return filepath.Join(stateDir, "registries-admin.d")
}

// BindPeers gives node the runtime's way to registries and returns pinner with the
// node-local mirror: each pin write tells the mirror what it may serve, then points the
// runtime at it (CRI-O's registries drop-in, containerd's hosts.toml blocks). The
// mirror's own registry access never goes through the mirror (it would ask itself): on
// CRI-O the administrator's registries files without its drop-in (copied into a
// scratch directory, kept up to date at every pin write); on containerd the hosts.toml
// files read without the mirror's host, and containerd's own content store.
func BindPeers(node *peers.Node, cfg conf.Config, runtimeName, stateDir string, secret *pullcreds.SecretFile, pinner pin.Pinner, client *cri.Client, log logrus.FieldLogger) (pin.Pinner, error) {
	rc, _ := RegistryAccess(cfg, runtimeName, stateDir)
	var rt peers.Runtime
	var files peers.Files
	if runtimeName == conf.RuntimeContainerd {
		hosts := &containerd.Hosts{ConfigPath: cfg.Containerd.ConfigPath, Dir: filepath.Join(stateDir, "containerd-hosts-mirror"), Skip: cfg.Peers.MirrorAddress}
		rc.RegistryFiles = hosts.Files
		content, err := containerd.DialContent(cfg.ContainerdSocket(), cfg.Containerd.Namespace)
		if err != nil {
			return nil, err
		}
		rt.Content = content
		files = &containerd.MirrorHosts{Local: cfg.Peers.MirrorAddress, ConfigPath: cfg.Containerd.ConfigPath,
			Record: hostsRecord(stateDir), Path: mirror.PathFor, Originals: original.New(stateDir)}
	} else {
		admin := &crio.AdminFiles{Main: cfg.Disk.RegistriesConf, Dir: cfg.Disk.RegistriesConfDir, Scratch: adminRegistriesDir(stateDir)}
		if _, _, err := admin.Read(); err != nil {
			log.WithError(err).Warn("[peers] reading the administrator's registries files")
		}
		rc.RegistriesConfDir = admin.Scratch
		files = &crio.MirrorRegistries{Local: cfg.Peers.MirrorAddress, Tags: cfg.Peers.TagAddress,
			Version: client.RuntimeVersion, Insecure: crio.NewLiveConfig(cfg.CRISocket()).InsecureRegistries,
			Admin: admin, Path: mirror.PathFor, Originals: original.New(stateDir)}
	}
	rt.Registry = mirror.FromRegistry(registry.New(rc, secret.Lookup))
	node.Bind(rt)
	return node.Pinner(pinner, files), nil
}
