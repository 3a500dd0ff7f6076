package conf

import (
	"strings"
	"testing"
	"time"
)

func TestDefaults(t *testing.T) {
	cfg, err := ParseConfig("")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.SetsDir != "/etc/imagepin/sets.d" || cfg.UnpinDelay.D() != 2*time.Minute || cfg.CRIO.Reload != "auto" ||
		cfg.Disk.LayerSizeMultiplier != 2 || cfg.CRI.PullTimeout.D() != 30*time.Minute || cfg.Report.Heartbeat.D() != 30*time.Second {
		t.Fatalf("defaults: %+v", cfg)
	}
	if cfg.EffectivePullConcurrency() != DefaultPullConcurrency {
		t.Fatal("pull_concurrency 0 must mean the default")
	}
}

func TestParseConfig(t *testing.T) {
	cfg, err := ParseConfig(`
sets_dir = "/tmp/sets"
unpin_delay = "5s"
[node]
name = "worker-3"
labels = {"node-role.kubernetes.io/worker" = ""}
[cri]
pull_concurrency = 8
[crio]
reload = "signal"
`)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.SetsDir != "/tmp/sets" || cfg.UnpinDelay.D() != 5*time.Second || cfg.Node.Name != "worker-3" ||
		cfg.CRI.PullConcurrency != 8 || cfg.CRIO.Reload != "signal" || cfg.Node.Labels["node-role.kubernetes.io/worker"] != "" {
		t.Fatalf("%+v", cfg)
	}
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	for text, want := range map[string]string{
		`sets_dri = "/x"`:                                               "unknown key sets_dri",
		"[crio]\nreloda = \"x\"":                                        "unknown key crio.reloda",
		"[crio]\nreload = \"dbus\"":                                     `crio.reload: must be auto, systemd or signal, got "dbus"`,
		`unpin_delay = "soon"`:                                          "unpin_delay",
		`sets_dir = "relative/path"`:                                    "sets_dir: must be an absolute path",
		"[cri]\nendpoint = \"tcp://x\"":                                 "cri.endpoint",
		"[cri]\npull_concurrency = -1":                                  "cri.pull_concurrency",
		"[disk]\nlayer_size_multiplier = 0.5":                           "disk.layer_size_multiplier",
		"[disk]\ngc_high_threshold_percent=101":                         "disk.gc_high_threshold_percent",
		"[metrics]\naddress = \"nohost\"":                               "metrics.address",
		"[node]\nlabels = {\"bad key!\" = \"\"}":                        "node.labels",
		"sets_dir = 3":                                                  "sets_dir",
		"[cri]\nruntime = \"docker\"":                                   `cri.runtime: must be auto, cri-o or containerd, got "docker"`,
		"[cluster]\nnode_condition = \"on\"":                            `cluster.node_condition: must be ready, registry-independent or off, got "on"`,
		"[containerd]\nnamespace = \"\"":                                "containerd.namespace",
		"[containerd]\nconfig_path = \"certs.d\"":                       "containerd.config_path: must be the absolute path",
		"[containerd]\nconfig_path = \"\"":                              "containerd.config_path: must be the absolute path of containerd's registry hosts directory",
		"[containerd]\nsocket = \"/x\"":                                 "unknown key containerd.socket",
		"[peers]\nenabled = true\nmirror_address = \"0.0.0.0:7443\"":    "peers.mirror_address: must be a loopback host:port",
		"[peers]\nenabled = true\naddress = \"10.0.0.2:7444\"":          "peers.ca: must be an absolute path when peers.address is set",
		"[peers]\nnodes = [\"10.0.0.3\"]\naddress = \"10.0.0.2:7444\"":  `peers.nodes: "10.0.0.3" must be host:port`,
		"[peers]\nnodes = [\"10.0.0.3:7444\"]":                          "peers.address: must be this node's host:port",
		"[peers]\naddress = \"10.0.0.2:7444\"\nmax_serving = 0":         "peers.max_serving: must be 1 to 256",
		"[peers]\naddress = \"10.0.0.2:7444\"\nfanout = 0":              "peers.fanout: must be 1 to 10000",
		"[report]\nkey = \"client-kubelet.key\"":                        "report.key: must be an absolute path",
		"[peers]\naddress = \"10.0.0.2:7444\"\nkey = \"serving.key\"":   "peers.key: must be an absolute path",
		"[peers]\naddress = \"10.0.0.2:7444\"\nclient_key = \"/c.key\"": "peers.client_key: must be empty when peers.client_cert is",
	} {
		_, err := ParseConfig(text)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want it to contain %q", text, err, want)
		}
	}
}

// One config file serves every node of a DaemonSet: each node's name and IP come on
// the command line, and the peer address keeps the file's port.
func TestOverrideFromTheCommandLine(t *testing.T) {
	cfg, err := ParseConfig("[peers]\nenabled = true\naddress = \"0.0.0.0:7444\"\ncert = \"/c\"\nca = \"/a\"\nclient_ca = \"/b\"")
	if err != nil {
		t.Fatal(err)
	}
	got, err := cfg.Override(Overrides{NodeName: "worker-3", PeerHost: "fd00::3"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Node.Name != "worker-3" || got.Peers.Address != "[fd00::3]:7444" {
		t.Fatalf("name %q, peers.address %q", got.Node.Name, got.Peers.Address)
	}
	if got, err := cfg.Override(Overrides{}); err != nil || got.Node.Name != cfg.Node.Name || got.Peers.Address != "0.0.0.0:7444" {
		t.Fatalf("no overrides changed the config: %+v, %v", got.Peers, err)
	}
	for o, want := range map[Overrides]string{
		{PeerHost: "worker-3.example"}: `--peer-host "worker-3.example": must be the node's IP address`,
	} {
		if _, err := cfg.Override(o); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want %q", o, err, want)
		}
	}
	if _, err := Default().Override(Overrides{PeerHost: "10.0.0.3"}); err == nil || !strings.Contains(err.Error(), "peers.address must be set") {
		t.Errorf("a peer host without peers.address: %v", err)
	}
}
