package wire

import (
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/conf"
)

// The node condition is on by default with [cluster] kubeconfig, off without it or when
// node_condition = "off".
func TestNodeConditionOnlyWithTheAPI(t *testing.T) {
	log := logrus.New()
	for _, tc := range []struct {
		kubeconfig, mode string
		on               bool
	}{
		{"", conf.NodeConditionReady, false},
		{"/var/lib/kubelet/kubeconfig", conf.NodeConditionReady, true},
		{"/var/lib/kubelet/kubeconfig", conf.NodeConditionRegistry, true},
		{"/var/lib/kubelet/kubeconfig", conf.NodeConditionOff, false},
	} {
		cfg := conf.Default()
		cfg.Node.Name = "worker-1"
		cfg.Cluster.Kubeconfig, cfg.Cluster.NodeCondition = tc.kubeconfig, tc.mode
		w, err := NodeCondition(cfg, "test", log)
		if err != nil {
			t.Fatal(err)
		}
		if (w != nil) != tc.on {
			t.Errorf("kubeconfig %q, node_condition %q: writer %v, want on=%v", tc.kubeconfig, tc.mode, w != nil, tc.on)
		}
	}
	if d := conf.Default(); d.Cluster.NodeCondition != conf.NodeConditionReady {
		t.Fatalf("default node_condition %q", d.Cluster.NodeCondition)
	}
}
