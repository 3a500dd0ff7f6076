// Package wire builds imagepind's agent and its collaborators from the config, in one
// place, for imagepind and `imagepinctl apply` alike.
package wire

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	goruntime "runtime"
	"time"

	"github.com/sirupsen/logrus"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"

	"github.com/imagepin/imagepin/agent"
	"github.com/imagepin/imagepin/clustersync"
	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/crio"
	"github.com/imagepin/imagepin/diskcheck"
	"github.com/imagepin/imagepin/internal/kube"
	"github.com/imagepin/imagepin/release"
	"github.com/imagepin/imagepin/state"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/systemd"
)

// Options are what differs between imagepind and imagepinctl apply.
type Options struct {
	Version string
	// SetsDir overrides cfg.SetsDir (apply uses a temporary directory).
	SetsDir string
	Publish func(status.Node)
	Log     *logrus.Logger
	// Observer counts pulls and reloads (metrics); Alive and Heartbeat feed the watchdog.
	Observer  agent.Observer
	Alive     func()
	Heartbeat time.Duration
	// Idle is called when the loop settles (agent.Deps.Idle).
	Idle func()
	// SourceFaults are the cluster sync's faults, shown in the node's status.
	SourceFaults func() []string
}

// Agent builds the agent. The caller closes the returned CRI client.
func Agent(cfg conf.Config, store *state.Store, opts Options) (*agent.Agent, *cri.Client, error) {
	nodeName, err := NodeName(cfg)
	if err != nil {
		return nil, nil, err
	}
	client, err := cri.Dial(cfg.CRI.Endpoint)
	if err != nil {
		return nil, nil, err
	}
	setsDir := cfg.SetsDir
	if opts.SetsDir != "" {
		setsDir = opts.SetsDir
	}
	socket := cfg.CRISocket()
	resolver := Resolver(cfg)
	a := agent.New(agent.Config{
		NodeName:        nodeName,
		Architecture:    goruntime.GOARCH,
		Version:         opts.Version,
		SetsDir:         setsDir,
		InlineLabels:    cfg.Node.Labels,
		LabelsFile:      cfg.Node.LabelsFile,
		PullSecret:      cfg.CRI.PullSecret,
		UnpinDelay:      cfg.UnpinDelay.D(),
		PullConcurrency: cfg.EffectivePullConcurrency(),
		PullTimeout:     cfg.CRI.PullTimeout.D(),
		RuntimeSocket:   socket,
		Heartbeat:       opts.Heartbeat,
	}, agent.Deps{
		Runtime:  client,
		DropIn:   crio.DropIn{MainConfig: cfg.CRIO.Config, ConfigDir: cfg.CRIO.ConfigDir, Cache: crio.NewFileCache()},
		Live:     crio.NewLiveConfig(socket),
		Reloader: Reloader(cfg, opts.Log),
		Disk:     DiskCheck(cfg, resolver, client, nodeName),
		Releases: &release.Cached{Dir: filepath.Join(store.Dir(), "releases"), Source: release.DockerSource(resolver.SystemContext)},
		State:    store,
		Publish:  opts.Publish,
		Log:      opts.Log,
		Observer: opts.Observer,
		Alive:    opts.Alive,
		Idle:     opts.Idle,

		SourceFaults: opts.SourceFaults,
	})
	return a, client, nil
}

// NodeName is [node] name, or the host name (the kubelet's default node name).
func NodeName(cfg conf.Config) (string, error) {
	if cfg.Node.Name != "" {
		return cfg.Node.Name, nil
	}
	return os.Hostname()
}

// ClusterSync is the [cluster] sync: the kubelet's kubeconfig, a dynamic client for the
// sets and a metadata-only client for the node's own Node (labels are all it needs).
func ClusterSync(cfg conf.Config, version string, log logrus.FieldLogger, onFaults func()) (*clustersync.Syncer, error) {
	nodeName, err := NodeName(cfg)
	if err != nil {
		return nil, err
	}
	rc, err := kube.Config(cfg.Cluster.Kubeconfig, "imagepind/"+version, 5, 10)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	meta, err := metadata.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return clustersync.New(dyn, meta, clustersync.Config{
		NodeName: nodeName, SetsDir: cfg.SetsDir, LabelsFile: cfg.Node.LabelsFile, OnFaults: onFaults, Log: log,
	}), nil
}

// Resolver reaches registries as CRI-O does ([disk] registries.conf, certs.d) with the
// credentials the kubelet would hand CRI-O for each image (the pull secret).
func Resolver(cfg conf.Config) *diskcheck.Resolver {
	keyring := &cri.KeyringFile{Path: cfg.CRI.PullSecret}
	return diskcheck.NewResolver(diskcheck.ResolverConfig{
		RegistriesConf:      cfg.Disk.RegistriesConf,
		RegistriesConfDir:   cfg.Disk.RegistriesConfDir,
		CertsDir:            cfg.Disk.CertsDir,
		AuthFile:            cfg.CRI.PullSecret,
		NoUncompressedSizes: !cfg.Disk.UncompressedSizes,
		Platform:            diskcheck.Platform{OS: goruntime.GOOS, Architecture: goruntime.GOARCH},
		Concurrency:         cfg.EffectivePullConcurrency(),
	}, keyring.Lookup)
}

// DiskCheck is the registry-backed disk check of [disk].
func DiskCheck(cfg conf.Config, resolver *diskcheck.Resolver, client *cri.Client, nodeName string) *diskcheck.Registry {
	return diskcheck.New(diskcheck.Config{
		NodeName:               nodeName,
		Multiplier:             cfg.Disk.LayerSizeMultiplier,
		GCHighThresholdPercent: cfg.Disk.GCHighThresholdPercent,
		KubeletConfig:          cfg.Disk.KubeletConfig,
	}, resolver, ImageFS(client))
}

// ImageFS finds the runtime's image filesystem with CRI ImageFsInfo.
func ImageFS(client *cri.Client) diskcheck.ImageFS {
	return func(ctx context.Context) (string, error) {
		fs, err := client.ImageFsInfo(ctx)
		if err != nil {
			return "", err
		}
		if fs.Mountpoint == "" {
			return "", errors.New("the runtime reported no image filesystem mountpoint")
		}
		return fs.Mountpoint, nil
	}
}

// Reloader is [crio] reload: systemd over D-Bus, SIGHUP to the socket's owner, or auto
// (systemd when the bus answers and knows the unit, else the signal).
func Reloader(cfg conf.Config, log logrus.FieldLogger) crio.Reloader {
	signal := crio.SignalReloader{Socket: cfg.CRISocket()}
	unit := &systemd.UnitReloader{Unit: cfg.CRIO.Unit}
	switch cfg.CRIO.Reload {
	case conf.ReloadSignal:
		return signal
	case conf.ReloadSystemd:
		return unit
	}
	return crio.FallbackReloader{
		Primary: unit, Fallback: signal,
		Unavailable: func(err error) bool { return errors.Is(err, systemd.ErrUnavailable) },
		OnFallback: func(err error) {
			log.WithError(err).Info("systemd unavailable for the reload; sending SIGHUP to CRI-O's socket owner")
		},
	}
}
