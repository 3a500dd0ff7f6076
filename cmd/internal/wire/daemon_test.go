package wire

import (
	"path/filepath"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/status"
)

// imagepind's publishers without an aggregator, a Node condition or [peers]: the status
// file is written before systemd is told the summary, and the parts switched off are
// left out (not called on nil).
func TestDaemonPublishWithThePartsOff(t *testing.T) {
	cfg := conf.Config{StatusFile: filepath.Join(t.TempDir(), "status.json")}
	var told []string
	var fileBefore bool
	notify := func(summary string) {
		_, err := status.ReadFile(cfg.StatusFile)
		fileBefore = err == nil
		told = append(told, summary)
	}
	publish := DaemonPublish(cfg, notify, Metrics(nil), Reporter(cfg, nil, nil, logrus.New()), nil, nil, logrus.New())
	publish(status.Node{Node: status.NodeInfo{Name: "w1"}, Sets: []status.Set{}})
	if len(told) != 1 || told[0] != "no sets for this node" || !fileBefore {
		t.Fatalf("told %q, status file written first: %v", told, fileBefore)
	}
	if n, err := status.ReadFile(cfg.StatusFile); err != nil || n.Node.Name != "w1" {
		t.Fatalf("status file: %+v, %v", n, err)
	}
}
