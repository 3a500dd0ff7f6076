package wire

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/conf"
)

// A [cluster] kubeconfig that is not there at start (the kubelet writes it later) is a
// sync fault, not an error that stops imagepind: before the fix ClusterSync failed and
// imagepind exited 1, restarting every 5 s under systemd without serving local files.
func TestClusterSyncWithoutKubeconfigStarts(t *testing.T) {
	dir := t.TempDir()
	cfg := conf.Default()
	cfg.SetsDir = filepath.Join(dir, "sets.d")
	cfg.Node.Name = "worker-1"
	cfg.Node.LabelsFile = filepath.Join(dir, "labels.json")
	cfg.Cluster.Kubeconfig = filepath.Join(dir, "kubeconfig")
	faulted := make(chan struct{}, 1)
	s, err := ClusterSync(cfg, "test", logrus.New(), func() {
		select {
		case faulted <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatalf("a missing kubeconfig stops the daemon: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-faulted:
	case <-time.After(10 * time.Second):
		t.Fatal("no fault")
	}
	if f := s.Faults(); len(f) != 1 || !strings.Contains(f[0], cfg.Cluster.Kubeconfig) {
		t.Fatalf("faults %v", f)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// imagepind and imagepinctl check size by one policy: with [peers] on, a CRI-O node
// keeps each layer compressed once more (the mirror's store), a containerd node does not.
func TestDiskCheckConfigIsTheDaemonsPolicy(t *testing.T) {
	cfg := conf.Default()
	cfg.Peers.Enabled = true
	if c := DiskCheckConfig(cfg, conf.RuntimeCRIO, "n"); !c.KeepsCompressed || !c.ThroughMirror || c.NodeName != "n" {
		t.Fatalf("CRI-O with [peers]: %+v", c)
	}
	if c := DiskCheckConfig(cfg, conf.RuntimeContainerd, "n"); c.KeepsCompressed || !c.ThroughMirror {
		t.Fatalf("containerd with [peers]: %+v", c)
	}
	cfg.Peers.Enabled = false
	if c := DiskCheckConfig(cfg, conf.RuntimeCRIO, "n"); c.KeepsCompressed || c.ThroughMirror {
		t.Fatalf("CRI-O without [peers]: %+v", c)
	}
}

// Pulls are ordered by layer on CRI-O straight from the registry only: containerd and
// the node-local mirror fetch each blob once already.
func TestOrderByLayers(t *testing.T) {
	cfg := conf.Default()
	for _, c := range []struct {
		runtime string
		peers   bool
		want    bool
	}{{conf.RuntimeCRIO, false, true}, {conf.RuntimeCRIO, true, false}, {conf.RuntimeContainerd, false, false}, {conf.RuntimeContainerd, true, false}} {
		cfg.Peers.Enabled = c.peers
		if got := OrderByLayers(cfg, c.runtime); got != c.want {
			t.Errorf("%s, [peers] %v: ordered %v, want %v", c.runtime, c.peers, got, c.want)
		}
	}
}
