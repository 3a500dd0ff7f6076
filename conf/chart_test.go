package conf

import (
	"os"
	"path/filepath"
	"testing"
)

// The Helm chart's imagepind.toml for each of its presets (packaging/helm/testdata, which
// the chart's own test keeps equal to what it renders) loads as imagepind loads it, with
// the node's name and IP that the DaemonSet passes on the command line.
func TestChartConfigsLoad(t *testing.T) {
	files, err := filepath.Glob("../packaging/helm/testdata/imagepind-*.toml")
	if err != nil || len(files) < 7 {
		t.Fatalf("the chart's configs: %v %v", files, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := ParseConfig(string(b))
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		cfg, err = cfg.Override(Overrides{NodeName: "worker-1", PeerHost: "10.0.0.7"})
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if cfg.Node.Name != "worker-1" || cfg.Peers.Address != "10.0.0.7:7444" || !cfg.Peers.Sharing() || cfg.Cluster.Kubeconfig == "" ||
			cfg.Report.Aggregator == "" || cfg.Kubelet.Binary != "" {
			t.Errorf("%s: node %q, peers %q, kubeconfig %q, aggregator %q, kubelet binary %q", f, cfg.Node.Name, cfg.Peers.Address,
				cfg.Cluster.Kubeconfig, cfg.Report.Aggregator, cfg.Kubelet.Binary)
		}
	}
}
