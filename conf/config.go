package conf

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/pullwidth"

	"github.com/BurntSushi/toml"
)

// DefaultConfigPath is where imagepind and imagepinctl look for the config by default.
const DefaultConfigPath = "/etc/imagepin/imagepind.toml"

// Config is imagepind's configuration. Every key is optional; Default() holds the defaults.
// docs/configuration.md documents each key.
type Config struct {
	SetsDir    string   `toml:"sets_dir"`
	StateDir   string   `toml:"state_dir"`
	StatusFile string   `toml:"status_file"`
	UnpinDelay Duration `toml:"unpin_delay"`

	Node       NodeConfig       `toml:"node"`
	CRI        CRIConfig        `toml:"cri"`
	CRIO       CRIOConfig       `toml:"crio"`
	Containerd ContainerdConfig `toml:"containerd"`
	Disk       DiskConfig       `toml:"disk"`
	Report     ReportConfig     `toml:"report"`
	Metrics    MetricsConfig    `toml:"metrics"`
	Cluster    ClusterConfig    `toml:"cluster"`
	Kubelet    KubeletConfig    `toml:"kubelet"`
	Peers      PeersConfig      `toml:"peers"`
	Seed       SeedConfig       `toml:"seed"`
}

// SeedConfig is the seed directory imagepind watches (docs/seeding.md): a medium an
// administrator copies or mounts there is seeded once it is complete, and the seed of
// a medium taken away is removed.
type SeedConfig struct {
	// Directory is the watched directory ("": none). It needs [peers] enabled.
	Directory string `toml:"directory"`
	// Settle is how long a medium must stay unchanged, with no process writing to it,
	// before it is seeded.
	Settle Duration `toml:"settle"`
}

func (c SeedConfig) validate() error {
	var p problems
	p.absoluteOrEmpty("seed.directory", c.Directory)
	if c.Settle < Duration(time.Second) || c.Settle > Duration(time.Hour) {
		p.add("seed.settle", "must be 1s to 1h, got %s", time.Duration(c.Settle))
	}
	return p.err()
}

// PeersConfig is the node-local mirror of pinned images and the sharing of their
// blobs between nodes (docs/peers.md).
type PeersConfig struct {
	// Enabled turns the mirror on: the runtime pulls pinned images through it.
	Enabled bool `toml:"enabled"`
	// MirrorAddress is where it listens (plain HTTP: loopback only).
	MirrorAddress string `toml:"mirror_address"`
	// TagAddress is where the mirror answers pinned tags to CRI-O (TLS with a node-local
	// CA, loopback only; docs/tags.md). "": tags are not pre-loaded on CRI-O.
	TagAddress string `toml:"tag_address"`
	// StoreDir keeps the pinned images' compressed blobs ("": <state_dir>/blobs).
	StoreDir string `toml:"store_dir"`

	// Address is where this node serves its peers (HTTPS), as they reach it: the
	// node's IP and a port, the same string as in the others' Nodes. "": this node
	// shares nothing and asks no peer.
	Address string `toml:"address"`
	// Nodes are the peers' addresses (this node's among them or not).
	Nodes []string `toml:"nodes"`
	// Cert is the serving certificate (the kubelet's serving certificate), Key its key
	// ("": in Cert, one PEM, as kubelet-server-current.pem); CA verifies the peers'
	// serving certificates.
	Cert string `toml:"cert"`
	Key  string `toml:"key"`
	CA   string `toml:"ca"`
	// ClientCert is the certificate this node presents to peers and ClientKey its key
	// ("", "": the report's cert and key, the kubelet's client certificate); ClientCA
	// verifies the certificates peers present (the cluster's kubelet client CA): only
	// nodes are served.
	ClientCert string `toml:"client_cert"`
	ClientKey  string `toml:"client_key"`
	ClientCA   string `toml:"client_ca"`
	// MaxServing bounds the requests served to peers at once; ServeMiBPerSecond their
	// bandwidth in all (0: no limit).
	MaxServing        int `toml:"max_serving"`
	ServeMiBPerSecond int `toml:"serve_mib_per_second"`
	// Fanout is how many nodes each node passes a blob on to, in the tree laid over
	// the blob's rendezvous order (a value as large as the cluster: every node reads it
	// from the one node that fetched it).
	Fanout int `toml:"fanout"`
}

func (c PeersConfig) validate() error {
	var p problems
	p.absoluteOrEmpty("peers.store_dir", c.StoreDir)
	if c.Enabled {
		if !loopback(c.MirrorAddress) {
			p.add("peers.mirror_address", "must be a loopback host:port (the mirror speaks plain HTTP), got %q", c.MirrorAddress)
		}
		if c.TagAddress != "" && (!loopback(c.TagAddress) || c.TagAddress == c.MirrorAddress) {
			p.add("peers.tag_address", "must be a loopback host:port other than peers.mirror_address (or \"\": no tags on CRI-O), got %q", c.TagAddress)
		}
	}
	if c.Address == "" && len(c.Nodes) == 0 {
		return p.err()
	}
	if _, _, err := net.SplitHostPort(c.Address); err != nil {
		p.add("peers.address", "must be this node's host:port as its peers reach it (it is in their peers.nodes): %v", err)
	}
	for _, n := range c.Nodes {
		if _, _, err := net.SplitHostPort(n); err != nil {
			p.add("peers.nodes", "%q must be host:port: %v", n, err)
		}
	}
	for _, kp := range [][2]string{{"peers.cert", c.Cert}, {"peers.ca", c.CA}, {"peers.client_ca", c.ClientCA}} {
		if kp[1] == "" || !filepath.IsAbs(kp[1]) {
			p.add(kp[0], "must be an absolute path when peers.address is set (peers talk HTTPS with the nodes' certificates), got %q", kp[1])
		}
	}
	if c.ClientCert != "" && !filepath.IsAbs(c.ClientCert) {
		p.add("peers.client_cert", "must be an absolute path or empty (the report's certificate), got %q", c.ClientCert)
	}
	p.absoluteOrEmpty("peers.key", c.Key)
	p.absoluteOrEmpty("peers.client_key", c.ClientKey)
	if c.ClientKey != "" && c.ClientCert == "" {
		p.add("peers.client_key", "must be empty when peers.client_cert is (the report's certificate and key are used), got %q", c.ClientKey)
	}
	if c.MaxServing < 1 || c.MaxServing > 256 {
		p.add("peers.max_serving", "must be 1 to 256, got %d", c.MaxServing)
	}
	if c.ServeMiBPerSecond < 0 {
		p.add("peers.serve_mib_per_second", "must be 0 (no limit) or more, got %d", c.ServeMiBPerSecond)
	}
	if c.Fanout < 1 || c.Fanout > 10000 {
		p.add("peers.fanout", "must be 1 to 10000, got %d", c.Fanout)
	}
	return p.err()
}

// Sharing says whether this node shares blobs with peers.
func (p PeersConfig) Sharing() bool { return p.Enabled && p.Address != "" }

// KubeletConfig is where the node's kubelet keeps what imagepind reads besides its
// config file ([disk] kubelet_config): the config drop-in directory (the kubelet's
// --config-dir) and its root directory (--root-dir), which holds the records of the
// pulls it made itself, and its binary, whose version says whether its image pull
// credential verification is on by default (run with --version only while neither the
// config nor the records say; "" never runs it).
type KubeletConfig struct {
	ConfigDir string `toml:"config_dir"`
	RootDir   string `toml:"root_dir"`
	Binary    string `toml:"binary"`
}

func (c KubeletConfig) validate() error {
	var p problems
	p.absoluteOrEmpty("kubelet.config_dir", c.ConfigDir)
	p.absoluteOrEmpty("kubelet.root_dir", c.RootDir)
	p.absoluteOrEmpty("kubelet.binary", c.Binary)
	return p.err()
}

// ClusterConfig is the cluster sync: PinnedImageSet objects and this node's labels from
// the Kubernetes API, with the kubelet's credentials.
type ClusterConfig struct {
	// Kubeconfig is the kubelet's kubeconfig (OpenShift: /var/lib/kubelet/kubeconfig);
	// empty: no API access, sets and labels come from files only.
	Kubeconfig string `toml:"kubeconfig"`
	// NodeCondition is what the node condition PinnedImagesReady on the node's own Node
	// asks of each set that targets the node: NodeConditionReady, NodeConditionRegistry
	// (Ready and RegistryIndependent) or NodeConditionOff (not written). Written only
	// with Kubeconfig.
	NodeCondition string `toml:"node_condition"`
}

func (c ClusterConfig) validate() error {
	var p problems
	p.absoluteOrEmpty("cluster.kubeconfig", c.Kubeconfig)
	switch c.NodeCondition {
	case NodeConditionReady, NodeConditionRegistry, NodeConditionOff:
	default:
		p.add("cluster.node_condition", "must be ready, registry-independent or off, got %q", c.NodeCondition)
	}
	return p.err()
}

// [cluster] node_condition values.
const (
	NodeConditionReady    = "ready"
	NodeConditionRegistry = "registry-independent"
	NodeConditionOff      = "off"
)

// NodeConfig says who this node is.
type NodeConfig struct {
	Name       string            `toml:"name"`
	Labels     map[string]string `toml:"labels"`
	LabelsFile string            `toml:"labels_file"`
}

func (c NodeConfig) validate() error {
	var p problems
	p.absoluteOrEmpty("node.labels_file", c.LabelsFile)
	if err := pinset.ValidateLabels(c.Labels); err != nil {
		p.add("node.labels", "%v", err)
	}
	return p.err()
}

// CRIConfig is how images are pulled.
type CRIConfig struct {
	Endpoint string `toml:"endpoint"`
	// Runtime is the container runtime behind Endpoint: RuntimeAuto (asked with CRI
	// Version at start), RuntimeCRIO or RuntimeContainerd.
	Runtime         string   `toml:"runtime"`
	PullConcurrency int      `toml:"pull_concurrency"`
	PullTimeout     Duration `toml:"pull_timeout"`
	PullSecret      string   `toml:"pull_secret"`
}

func (c CRIConfig) validate() error {
	var p problems
	if !strings.HasPrefix(c.Endpoint, "unix://") || len(c.Endpoint) == len("unix://") {
		p.add("cri.endpoint", "must be unix:///path/to/socket, got %q", c.Endpoint)
	}
	if c.PullConcurrency < 0 || c.PullConcurrency > 128 {
		p.add("cri.pull_concurrency", "must be 0 (default: at most 64) to 128, got %d", c.PullConcurrency)
	}
	if c.PullTimeout <= 0 {
		p.add("cri.pull_timeout", "must be positive")
	}
	switch c.Runtime {
	case RuntimeAuto, RuntimeCRIO, RuntimeContainerd:
	default:
		p.add("cri.runtime", "must be auto, cri-o or containerd, got %q", c.Runtime)
	}
	p.absoluteOrEmpty("cri.pull_secret", c.PullSecret)
	return p.err()
}

// Runtimes for [cri] runtime: the names CRI Version reports.
const (
	RuntimeAuto       = "auto"
	RuntimeCRIO       = "cri-o"
	RuntimeContainerd = "containerd"
)

// ContainerdConfig is how imagepind reaches containerd beyond CRI: its images API (the
// pinned label) and its registry hosts directory (for the disk check).
type ContainerdConfig struct {
	// Address is containerd's API socket; "" means the CRI endpoint's (containerd
	// serves both on one socket).
	Address string `toml:"address"`
	// Namespace is the CRI plugin's containerd namespace.
	Namespace string `toml:"namespace"`
	// ConfigPath is the CRI plugin's registry.config_path (hosts.toml per registry).
	ConfigPath string `toml:"config_path"`
}

func (c ContainerdConfig) validate() error {
	var p problems
	p.absoluteOrEmpty("containerd.address", strings.TrimPrefix(c.Address, "unix://"))
	// Every path under config_path is joined to it: an empty one would make imagepind
	// read (and, with [peers] on, write <registry>/hosts.toml) relative to its working
	// directory.
	if !filepath.IsAbs(c.ConfigPath) {
		p.add("containerd.config_path", "must be the absolute path of containerd's registry hosts directory (the CRI plugin's registry config_path, e.g. /etc/containerd/certs.d), got %q; remove the key for the default", c.ConfigPath)
	}
	if c.Namespace == "" || strings.ContainsAny(c.Namespace, "/ \t\n") {
		p.add("containerd.namespace", "must be a containerd namespace such as k8s.io, got %q", c.Namespace)
	}
	return p.err()
}

// Reload modes for [crio] reload.
const (
	ReloadAuto    = "auto"
	ReloadSystemd = "systemd"
	ReloadSignal  = "signal"
)

// CRIOConfig is where CRI-O's config lives and how to make it re-read it.
type CRIOConfig struct {
	Config    string `toml:"config"`
	ConfigDir string `toml:"config_dir"`
	Unit      string `toml:"unit"`
	Reload    string `toml:"reload"`
}

func (c CRIOConfig) validate() error {
	var p problems
	p.absolute("crio.config", c.Config)
	p.absolute("crio.config_dir", c.ConfigDir)
	switch c.Reload {
	case ReloadAuto, ReloadSystemd, ReloadSignal:
	default:
		p.add("crio.reload", "must be auto, systemd or signal, got %q", c.Reload)
	}
	if c.Unit == "" && c.Reload != ReloadSignal {
		p.add("crio.unit", "must be set unless reload = \"signal\"")
	}
	return p.err()
}

// DiskConfig is what the disk check reads.
type DiskConfig struct {
	RegistriesConf      string  `toml:"registries_conf"`
	RegistriesConfDir   string  `toml:"registries_conf_dir"`
	CertsDir            string  `toml:"certs_dir"`
	LayerSizeMultiplier float64 `toml:"layer_size_multiplier"`
	// UncompressedSizes: learn each layer's uncompressed size from the blob (a Range
	// request per distinct layer); false: the multiplier alone.
	UncompressedSizes      bool   `toml:"uncompressed_sizes"`
	GCHighThresholdPercent int    `toml:"gc_high_threshold_percent"`
	KubeletConfig          string `toml:"kubelet_config"`
	// PullWhileChecking: while the check asks uncompressed sizes, pull the images of a
	// new set that fit the room whatever the verdict (without [peers]); false: nothing
	// is pulled before the verdict.
	PullWhileChecking bool `toml:"pull_while_checking"`
}

func (c DiskConfig) validate() error {
	var p problems
	p.absoluteOrEmpty("disk.registries_conf", c.RegistriesConf)
	p.absoluteOrEmpty("disk.registries_conf_dir", c.RegistriesConfDir)
	p.absoluteOrEmpty("disk.certs_dir", c.CertsDir)
	p.absoluteOrEmpty("disk.kubelet_config", c.KubeletConfig)
	if c.LayerSizeMultiplier < 1 || c.LayerSizeMultiplier > 100 {
		p.add("disk.layer_size_multiplier", "must be between 1 and 100, got %g", c.LayerSizeMultiplier)
	}
	if c.GCHighThresholdPercent < 0 || c.GCHighThresholdPercent > 100 {
		p.add("disk.gc_high_threshold_percent", "must be 0 (kubelet's) to 100, got %d", c.GCHighThresholdPercent)
	}
	return p.err()
}

// ReportConfig is where node reports go.
type ReportConfig struct {
	Aggregator string   `toml:"aggregator"`
	Heartbeat  Duration `toml:"heartbeat"`
	// Cert is the node's client certificate, Key its key ("": in Cert, one PEM, as
	// kubelet-client-current.pem); CA verifies the aggregator's serving certificate.
	Cert string `toml:"cert"`
	Key  string `toml:"key"`
	CA   string `toml:"ca"`
	// ServerName is the name to verify in the aggregator's certificate when it differs
	// from the host in Aggregator (reached by a NodePort or an IP).
	ServerName string `toml:"server_name"`
}

func (c ReportConfig) validate() error {
	var p problems
	p.absoluteOrEmpty("report.key", c.Key)
	if c.Heartbeat < Duration(time.Second) {
		p.add("report.heartbeat", "must be at least 1s")
	}
	return p.err()
}

// MetricsConfig is the Prometheus listener.
type MetricsConfig struct {
	Address string `toml:"address"`
}

func (c MetricsConfig) validate() error {
	var p problems
	if c.Address != "" {
		if _, _, err := net.SplitHostPort(c.Address); err != nil {
			p.add("metrics.address", "must be host:port: %v", err)
		}
	}
	return p.err()
}

// DefaultPullConcurrency is what pull_concurrency = 0 means: the most pulls at once
// (pullwidth.DefaultWidest, where the figure is explained).
const DefaultPullConcurrency = pullwidth.DefaultWidest

// Default returns the configuration used when a key is absent.
func Default() Config {
	return Config{
		SetsDir:    "/etc/imagepin/sets.d",
		StateDir:   "/var/lib/imagepin",
		StatusFile: "/run/imagepin/status.json",
		UnpinDelay: Duration(2 * time.Minute),
		Node: NodeConfig{
			LabelsFile: "/etc/imagepin/node-labels.json",
		},
		CRI: CRIConfig{
			Endpoint:    "unix:///var/run/crio/crio.sock",
			Runtime:     RuntimeAuto,
			PullTimeout: Duration(30 * time.Minute),
			PullSecret:  "/var/lib/kubelet/config.json",
		},
		CRIO: CRIOConfig{
			Config:    "/etc/crio/crio.conf",
			ConfigDir: "/etc/crio/crio.conf.d",
			Unit:      "crio.service",
			Reload:    ReloadAuto,
		},
		Containerd: ContainerdConfig{
			Namespace:  "k8s.io",
			ConfigPath: "/etc/containerd/certs.d",
		},
		Disk: DiskConfig{
			RegistriesConf:      "/etc/containers/registries.conf",
			RegistriesConfDir:   "/etc/containers/registries.conf.d",
			CertsDir:            "/etc/containers/certs.d",
			LayerSizeMultiplier: 2.0,
			UncompressedSizes:   true,
			PullWhileChecking:   true,
			KubeletConfig:       "/etc/kubernetes/kubelet.conf",
		},
		Peers: PeersConfig{MirrorAddress: "127.0.0.1:7443", TagAddress: "127.0.0.1:7445", Cert: "/var/lib/kubelet/pki/kubelet-server-current.pem",
			MaxServing: 64, ServeMiBPerSecond: 50, Fanout: 2},
		Cluster: ClusterConfig{NodeCondition: NodeConditionReady},
		Seed:    SeedConfig{Settle: Duration(10 * time.Second)},
		Kubelet: KubeletConfig{
			ConfigDir: "/etc/kubernetes/kubelet.conf.d",
			RootDir:   "/var/lib/kubelet",
			Binary:    "/usr/bin/kubelet",
		},
		Report: ReportConfig{
			Heartbeat: Duration(30 * time.Second),
			Cert:      "/var/lib/kubelet/pki/kubelet-client-current.pem",
		},
	}
}

// LoadConfig reads the TOML file at path over the defaults and validates the result.
// A missing file at the default path means "all defaults"; a missing file named
// explicitly is an error.
func LoadConfig(path string, explicit bool) (Config, error) {
	cfg := Default()
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
	case errors.Is(err, os.ErrNotExist) && !explicit:
		return cfg, cfg.Validate()
	default:
		return cfg, fmt.Errorf("read config: %w", err)
	}
	if err := cfg.decode(string(data)); err != nil {
		return cfg, fmt.Errorf("%s: %w", path, err)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig decodes TOML text over the defaults and validates it.
func ParseConfig(text string) (Config, error) {
	cfg := Default()
	if err := cfg.decode(text); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

func (c *Config) decode(text string) error {
	md, err := toml.Decode(text, c)
	if err != nil {
		return err
	}
	if undecoded := md.Undecoded(); len(undecoded) > 0 {
		keys := make([]string, len(undecoded))
		for i, k := range undecoded {
			keys[i] = k.String()
		}
		return fmt.Errorf("unknown key %s", strings.Join(keys, ", "))
	}
	return nil
}

// Validate checks every value and names the key that is wrong. It does not look at the
// host (whether paths exist); the daemon does that when it uses them. Each section
// checks its own keys (its validate, beside its type); the rules that span sections
// are here.
func (c *Config) Validate() error {
	var p problems
	p.absolute("sets_dir", c.SetsDir)
	p.absolute("state_dir", c.StateDir)
	p.absolute("status_file", c.StatusFile)
	if c.UnpinDelay < 0 {
		p.add("unpin_delay", "must not be negative")
	}
	if c.Seed.Directory != "" && !c.Peers.Enabled {
		p.add("seed.directory", "needs [peers] enabled = true: seeds go to the node-local mirror's store, which exists only then")
	}
	if c.Cluster.Kubeconfig != "" && c.Node.LabelsFile == "" {
		p.add("node.labels_file", "must be set when cluster.kubeconfig is: the Node's labels from the API are written there")
	}
	return errors.Join(append(p,
		c.Node.validate(), c.CRI.validate(), c.CRIO.validate(), c.Containerd.validate(),
		c.Disk.validate(), c.Report.validate(), c.Metrics.validate(), c.Cluster.validate(),
		c.Kubelet.validate(), c.Peers.validate(), c.Seed.validate())...)
}

// problems are a section's wrong values, each error naming its key.
type problems []error

func (p *problems) add(key, format string, args ...any) {
	*p = append(*p, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
}

// absolute: the key must hold an absolute path.
func (p *problems) absolute(key, path string) {
	if !filepath.IsAbs(path) {
		p.add(key, "must be an absolute path, got %q", path)
	}
}

// absoluteOrEmpty: the key must hold an absolute path or nothing.
func (p *problems) absoluteOrEmpty(key, path string) {
	if path != "" && !filepath.IsAbs(path) {
		p.add(key, "must be an absolute path or empty, got %q", path)
	}
}

// loopback says whether addr is a loopback IP's host:port.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	ip := net.ParseIP(host)
	return err == nil && ip != nil && ip.IsLoopback()
}

func (p problems) err() error { return errors.Join(p...) }

// CRISocket is the filesystem path of the CRI endpoint.
func (c *Config) CRISocket() string { return strings.TrimPrefix(c.CRI.Endpoint, "unix://") }

// ContainerdSocket is containerd's API socket: [containerd] address, else the CRI
// endpoint's.
func (c *Config) ContainerdSocket() string {
	if c.Containerd.Address != "" {
		return strings.TrimPrefix(c.Containerd.Address, "unix://")
	}
	return c.CRISocket()
}

// EffectivePullConcurrency resolves pull_concurrency = 0 to the default.
func (c *Config) EffectivePullConcurrency() int {
	if c.CRI.PullConcurrency == 0 {
		return DefaultPullConcurrency
	}
	return c.CRI.PullConcurrency
}

// Duration is a time.Duration written as a Go duration string ("2m", "30s") in TOML.
type Duration time.Duration

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Overrides are what a DaemonSet gives each node's imagepind on its command line (from
// the downward API), where one config file serves every node.
type Overrides struct {
	// NodeName replaces [node] name (the Node's name, spec.nodeName).
	NodeName string
	// PeerHost replaces the host of [peers] address (the node's IP, status.hostIP); the
	// port stays.
	PeerHost string
}

// Override returns c with o's non-empty values in place, validated; an error names the
// key and the flag.
func (c Config) Override(o Overrides) (Config, error) {
	if o.NodeName != "" {
		c.Node.Name = o.NodeName
	}
	if o.PeerHost != "" {
		_, port, err := net.SplitHostPort(c.Peers.Address)
		if err != nil {
			return c, fmt.Errorf("--peer-host %s: peers.address must be set to host:port (its port is kept), got %q", o.PeerHost, c.Peers.Address)
		}
		if net.ParseIP(o.PeerHost) == nil {
			return c, fmt.Errorf("--peer-host %q: must be the node's IP address", o.PeerHost)
		}
		c.Peers.Address = net.JoinHostPort(o.PeerHost, port)
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("with the command line's values: %w", err)
	}
	return c, nil
}
