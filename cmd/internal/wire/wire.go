// Package wire builds imagepind's agent and its collaborators from the config, in one
// place, for imagepind and `imagepinctl apply` alike.
package wire

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"

	"github.com/imagepin/imagepin/agent"
	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/clustersync"
	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/containerd"
	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/crio"
	"github.com/imagepin/imagepin/diskcheck"
	"github.com/imagepin/imagepin/internal/kube"
	"github.com/imagepin/imagepin/kubelet"
	"github.com/imagepin/imagepin/original"
	"github.com/imagepin/imagepin/peers"
	"github.com/imagepin/imagepin/pin"
	"github.com/imagepin/imagepin/pullcreds"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/release"
	"github.com/imagepin/imagepin/seed"
	"github.com/imagepin/imagepin/state"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/systemd"
	"github.com/imagepin/imagepin/tags"
)

// Options are what differs between imagepind and imagepinctl apply.
type Options struct {
	// Peers, when not nil, is the node-local mirror (NewPeers): the pinner also tells it
	// what is pinned and points the runtime at it (BindPeers).
	Peers   *peers.Node
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
	// SourceFaults are the cluster sync's faults, shown in the node's status;
	// SourceSynced says whether it has written its first lists (agent.Deps).
	SourceFaults func() []string
	SourceSynced func() bool
	// Tags asks for the pre-load of the tags the sets pin (imagepind; not apply): Agent
	// builds their run-time once the runtime is known (Built.Tags, for the caller to
	// run) and gives it to the agent; TagsChanged is called when what it reports changes.
	Tags        bool
	TagsChanged func()
	// DetectFor bounds the wait for the runtime's CRI Version with [cri] runtime = auto
	// (0: 10 s).
	DetectFor time.Duration
	// HoldingsChanged is called when what the node's stores hold of the pinned images
	// changed ([peers] on): the agent's status reports it.
	HoldingsChanged func()
	// Holders is the aggregator's count of the holders of the sets' blobs (the
	// reporter's); nil: no aggregator, and no set is RegistryIndependent.
	Holders agent.HolderCounts
}

// Built is what Agent builds, for the caller to run.
type Built struct {
	Agent *agent.Agent
	// Client is the CRI client the agent speaks; the caller closes it.
	Client *cri.Client
	// Tags is the tags' run-time with Options.Tags (nil without): the agent tells it
	// the tags wanted and asks it which are held; the caller runs it (tags.Node.Run).
	Tags *tags.Node
}

// Agent builds the agent, and with Options.Tags the tags' run-time. The caller closes
// the CRI client (Built.Client).
func Agent(cfg conf.Config, store *state.Store, opts Options) (Built, error) {
	nodeName, err := NodeName(cfg)
	if err != nil {
		return Built{}, err
	}
	client, err := cri.Dial(cfg.CRI.Endpoint)
	if err != nil {
		return Built{}, err
	}
	setsDir := cfg.SetsDir
	if opts.SetsDir != "" {
		setsDir = opts.SetsDir
	}
	socket := cfg.CRISocket()
	runtimeName := DetectRuntime(cfg, client, opts.DetectFor, opts.Log)
	// The pull secret is read by one SecretFile for the whole daemon: the agent's pulls,
	// the disk check's and release expansion's registry access, the mirror's.
	secret := &pullcreds.SecretFile{Path: cfg.CRI.PullSecret}
	registries, registryProblems := RegistryFor(cfg, runtimeName, store.Dir(), secret)
	// With [peers] on, the disk check and release expansion read registries as CRI-O
	// does, through the node-local mirror first: a pinned image's manifest comes from
	// the node's store or its peers when the registry is gone (a node joining late
	// could not size its sets otherwise), and anything else goes on to its registry.
	pinner, err := Pinner(cfg, runtimeName, store.Dir(), opts.Log)
	if err != nil {
		client.Close()
		return Built{}, err
	}
	if opts.Peers != nil {
		if pinner, err = BindPeers(opts.Peers, cfg, runtimeName, store.Dir(), secret, pinner, client, opts.Log); err != nil {
			client.Close()
			return Built{}, err
		}
	}
	// A release image seeded on the node (or kept for a pinned one) is expanded from the
	// node's store, with no registry.
	var stored registry.Store
	if s := opts.Peers.Store(); s != nil {
		stored = s
	}
	built := Built{Client: client}
	var agentTags agent.Tags // nil, not a nil *tags.Node, without tags
	if opts.Tags {
		if built.Tags, err = Tags(cfg, runtimeName, store.Dir(), client, opts.Peers, secret, opts.TagsChanged, opts.Log); err != nil {
			client.Close()
			return Built{}, err
		}
		agentTags = built.Tags
	}
	var registryBytes func(string) int64
	var seeds func([]string) (*status.Seeded, []string)
	if opts.Peers != nil {
		registryBytes = opts.Peers.Bytes.RegistryBytes
		opts.Peers.OnHoldings(opts.HoldingsChanged)
		// The seeds are in the node's status only with the store they are in.
		seeds = seed.NewReport(seed.Dir(store.Dir()), cfg.Seed.Directory).Status
	}
	built.Agent = agent.New(agent.Config{
		NodeName:        nodeName,
		Architecture:    goruntime.GOARCH,
		Version:         opts.Version,
		SetsDir:         setsDir,
		ClusterSync:     cfg.Cluster.Kubeconfig != "" && opts.SetsDir == "",
		InlineLabels:    cfg.Node.Labels,
		LabelsFile:      cfg.Node.LabelsFile,
		PullSecret:      cfg.CRI.PullSecret,
		UnpinDelay:      cfg.UnpinDelay.D(),
		PullConcurrency: cfg.EffectivePullConcurrency(),
		OrderByLayers:   OrderByLayers(cfg, runtimeName),
		// With [peers] a pin lets the node-local mirror fill its store for peers.
		PinWhileChecking: !cfg.Peers.Enabled,
		PullEarly:        !cfg.Peers.Enabled && cfg.Disk.PullWhileChecking,
		PullTimeout:      cfg.CRI.PullTimeout.D(),
		RuntimeSocket:    socket,
		Heartbeat:        opts.Heartbeat,
	}, agent.Deps{
		Runtime:  client,
		Pinners:  map[string]pin.Pinner{runtimeName: pinner},
		Disk:     DiskCheck(cfg, runtimeName, registries, client, nodeName, opts.Peers.Store()),
		Secret:   secret,
		Kubelet:  Kubelet(cfg),
		Releases: &release.Cached{Dir: filepath.Join(store.Dir(), "releases"), Source: registry.StoreFirst{Client: registries, Store: stored}},
		State:    store,
		Publish:  opts.Publish,
		Log:      opts.Log,
		Observer: opts.Observer,
		Alive:    opts.Alive,
		Idle:     opts.Idle,

		RegistryBytes: registryBytes,
		Tags:          agentTags,
		Seeds:         seeds,
		SourceFaults:  joinFaults(opts.SourceFaults, registryProblems),
		SourceSynced:  opts.SourceSynced,
		Blobs:         blobsOf(opts.Peers),
		Holders:       opts.Holders,
	})
	// Peers the aggregator names for the first time: pulls that failed without them are
	// tried again at once (a joining node with the registry gone).
	opts.Peers.OnPeers(built.Agent.SourcesChanged)
	return built, nil
}

// blobsOf is what the node's stores hold of each pinned image's blobs (peers.Node,
// read off the agent's loop), for the aggregator's count of holders; nil with [peers]
// off (the node holds none for peers).
func blobsOf(p *peers.Node) agent.BlobHoldings {
	if p == nil {
		return nil
	}
	return p
}

func joinFaults(fs ...func() []string) func() []string {
	return func() []string {
		var out []string
		for _, f := range fs {
			if f != nil {
				out = append(out, f()...)
			}
		}
		return out
	}
}

// DetectRuntime is [cri] runtime: named, or (auto) the name the runtime gives in CRI
// Version, asked for up to wait (0: 10 s) at start (imagepind's unit starts after the
// runtime's).
// A runtime that does not answer by then is guessed from the socket's path
// ("containerd" in it: containerd; else CRI-O) and the guess logged; the agent reports
// a runtime that answers under another name later as a fault.
func DetectRuntime(cfg conf.Config, client *cri.Client, wait time.Duration, log logrus.FieldLogger) string {
	if cfg.CRI.Runtime != conf.RuntimeAuto {
		return cfg.CRI.Runtime
	}
	if wait <= 0 {
		wait = 10 * time.Second
	}
	deadline := time.Now().Add(wait)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		v, err := client.Version(ctx)
		cancel()
		if err == nil {
			switch v.Name {
			case conf.RuntimeCRIO, conf.RuntimeContainerd:
				return v.Name
			}
			log.WithField("runtime", v.Name).Warn("container runtime neither cri-o nor containerd; pinning as CRI-O")
			return conf.RuntimeCRIO
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	guess := conf.RuntimeCRIO
	if strings.Contains(cfg.CRISocket(), "containerd") {
		guess = conf.RuntimeContainerd
	}
	log.WithField("runtime", guess).WithField("endpoint", cfg.CRI.Endpoint).Warn("container runtime not answering; guessed from the socket's path ([cri] runtime names it)")
	return guess
}

// Pinner is the runtime-specific part of pinning: CRI-O's managed drop-in, reloaded
// ([crio]), or containerd's pinned label ([containerd]), its record in the state dir.
func Pinner(cfg conf.Config, runtimeName, stateDir string, log logrus.FieldLogger) (pin.Pinner, error) {
	if runtimeName == conf.RuntimeContainerd {
		images, err := containerd.DialImages(cfg.ContainerdSocket(), cfg.Containerd.Namespace)
		if err != nil {
			return nil, err
		}
		return &containerd.Pinner{Images: images, Events: images, Namespace: cfg.Containerd.Namespace,
			Record: filepath.Join(stateDir, "containerd-labels.json"), Log: log}, nil
	}
	return &crio.Pinner{
		DropIn:   crio.DropIn{MainConfig: cfg.CRIO.Config, ConfigDir: cfg.CRIO.ConfigDir, Cache: crio.NewFileCache(), Originals: original.New(stateDir)},
		Live:     crio.NewLiveConfig(cfg.CRISocket()),
		Reloader: Reloader(cfg, log),
		Settle:   crio.ReloadSettle,
	}, nil
}

// RegistryFor is the registry client of the runtime (RegistryAccess), with the
// credentials the kubelet would hand it (from secret, the daemon's one reader of the
// pull secret), and a func listing its problems for the node's faults.
func RegistryFor(cfg conf.Config, runtimeName, stateDir string, secret *pullcreds.SecretFile) (*registry.Client, func() []string) {
	rc, problems := RegistryAccess(cfg, runtimeName, stateDir)
	rc.SizeCache = registry.SizeCacheIn(stateDir) // the daemon's client alone writes it
	return registry.New(rc, secret.Lookup), problems
}

// RegistryAccess is how the runtime reaches registries, for whatever imagepin asks a
// registry (sizes, releases, tags): CRI-O's registries.conf and certs.d ([disk]), or
// containerd's hosts directory ([containerd] config_path) translated under dir, whose
// problems the func lists.
func RegistryAccess(cfg conf.Config, runtimeName, dir string) (registry.Config, func() []string) {
	rc := registry.Config{
		RegistriesConf:      cfg.Disk.RegistriesConf,
		RegistriesConfDir:   cfg.Disk.RegistriesConfDir,
		CertsDir:            cfg.Disk.CertsDir,
		AuthFile:            cfg.CRI.PullSecret,
		NoUncompressedSizes: !cfg.Disk.UncompressedSizes,
		Platform:            registry.Platform{OS: goruntime.GOOS, Architecture: goruntime.GOARCH},
	}
	if runtimeName != conf.RuntimeContainerd {
		return rc, func() []string { return nil }
	}
	hosts := &containerd.Hosts{ConfigPath: cfg.Containerd.ConfigPath, Dir: filepath.Join(dir, "containerd-hosts")}
	rc.RegistryFiles = hosts.Files
	return rc, func() []string {
		var out []string
		for _, p := range hosts.Problems() {
			out = append(out, "containerd registry hosts: "+p)
		}
		return out
	}
}

// GuessRuntime is [cri] runtime without asking the runtime (the command line's
// registry access): named, or "containerd" when the CRI socket's path says so.
func GuessRuntime(cfg conf.Config) string {
	if cfg.CRI.Runtime != conf.RuntimeAuto {
		return cfg.CRI.Runtime
	}
	if strings.Contains(cfg.CRISocket(), "containerd") {
		return conf.RuntimeContainerd
	}
	return conf.RuntimeCRIO
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
	// The kubeconfig is read when the sync starts and again until it loads: a node whose
	// kubelet has not written it yet still serves its local set files.
	connect := func() (dynamic.Interface, metadata.Interface, error) {
		rc, err := kube.Config(cfg.Cluster.Kubeconfig, "imagepind/"+version, 5, 10)
		if err != nil {
			return nil, nil, err
		}
		dyn, err := dynamic.NewForConfig(rc)
		if err != nil {
			return nil, nil, err
		}
		meta, err := metadata.NewForConfig(rc)
		if err != nil {
			return nil, nil, err
		}
		return dyn, meta, nil
	}
	return clustersync.NewConnecting(connect, clustersync.Config{
		NodeName: nodeName, SetsDir: cfg.SetsDir, LabelsFile: cfg.Node.LabelsFile, OnFaults: onFaults, OnSynced: onFaults, Log: log,
	}), nil
}

// Registry reaches registries as the node's runtime does (GuessRuntime; containerd's
// hosts translated under the temporary directory) with the credentials the kubelet
// would hand it for each image (the pull secret): the command line's registry access.
func Registry(cfg conf.Config) *registry.Client {
	return RegistryOn(cfg, registry.Platform{OS: goruntime.GOOS, Architecture: goruntime.GOARCH})
}

// RegistryOn is Registry reading images for platform p (a list's instance for p:
// imagepinctl release --platform).
func RegistryOn(cfg conf.Config, p registry.Platform) *registry.Client {
	rc, _ := RegistryAccess(cfg, GuessRuntime(cfg), filepath.Join(os.TempDir(), "imagepinctl"))
	rc.Platform = p
	secret := &pullcreds.SecretFile{Path: cfg.CRI.PullSecret}
	return registry.New(rc, secret.Lookup)
}

// DiskCheck is the registry-backed disk check of [disk]; with [peers] on it sizes what
// the node's blob store holds (store: seeded images, and those filled before) from there.
func DiskCheck(cfg conf.Config, runtimeName string, registries *registry.Client, client *cri.Client, nodeName string, store *blobstore.Store) *diskcheck.Checker {
	dc := DiskCheckConfig(cfg, runtimeName, nodeName)
	if store != nil {
		dc.Store = store
	}
	return diskcheck.New(dc, registries, diskcheck.CachedImageFS(ImageFS(client), 10*time.Minute, time.Now))
}

// OrderByLayers says whether the agent orders pulls so that no layer is fetched by two
// pulls at once (agent.Config.OrderByLayers). CRI-O (containers/image) fetches a layer
// once for each pull that needs it at the same time. containerd does not need it: its
// content store locks an ingest by its ref (the layer's digest), and a second pull of
// the same blob waits for the lock (content.OpenWriter retries while the ref is
// locked) and then finds the blob committed. Nor does a node with [peers] on: CRI-O
// pulls through the node-local mirror, which fetches each blob from the registry once
// however many pulls ask for it; the order would only make the images on a shared layer
// wait for the first (release-shaped set, 40 images on two shared base layers behind
// 100 ms / 1 MB/s: 21.1 s ordered, 18.6 s not, the same bytes over the link).
func OrderByLayers(cfg conf.Config, runtimeName string) bool {
	return runtimeName != conf.RuntimeContainerd && !cfg.Peers.Enabled
}

// DiskCheckConfig is the disk check's policy from the config: what imagepind admits by,
// and what `imagepinctl check` predicts with.
func DiskCheckConfig(cfg conf.Config, runtimeName, nodeName string) diskcheck.Config {
	return diskcheck.Config{
		NodeName:               nodeName,
		Multiplier:             cfg.Disk.LayerSizeMultiplier,
		GCHighThresholdPercent: cfg.Disk.GCHighThresholdPercent,
		KubeletConfig:          cfg.Disk.KubeletConfig,
		KubeletConfigDir:       cfg.Kubelet.ConfigDir,
		// CRI-O keeps no compressed blobs: the mirror's store is more disk;
		// containerd's content store already holds them.
		KeepsCompressed: cfg.Peers.Enabled && runtimeName != conf.RuntimeContainerd,
		ThroughMirror:   cfg.Peers.Enabled,
	}
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

// Kubelet reads what the kubelet will do at pod start with images already on the node:
// its config ([disk] kubelet_config) with its drop-ins ([kubelet] config_dir), the
// records of its own pulls under [kubelet] root_dir and, when those do not say whether
// its credential verification is on, the version of [kubelet] binary.
func Kubelet(cfg conf.Config) func() (kubelet.Verification, error) {
	r := kubelet.Reader{ConfigFile: cfg.Disk.KubeletConfig, ConfigDir: cfg.Kubelet.ConfigDir, RootDir: cfg.Kubelet.RootDir}
	if cfg.Kubelet.Binary != "" {
		r.Version = kubelet.NewBinary(cfg.Kubelet.Binary)
	}
	return r.Read
}
