package wire

import (
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/metrics"
	"github.com/imagepin/imagepin/nodecondition"
	"github.com/imagepin/imagepin/peers"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/report"
	"github.com/imagepin/imagepin/seed"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/watch"
)

// Watch is what imagepind watches for a look at the node (each change triggers a
// reconcile): the sets directory and its cluster subdirectory, the labels file, CRI-O's
// config and drop-ins, the pull secret, the kubelet's config and drop-ins (its GC
// threshold and pod-start credential checks), and the runtime's socket (re-created: the
// runtime restarted, and may have wiped images).
func Watch(cfg conf.Config, log logrus.FieldLogger) *watch.Watcher {
	return watch.New(250*time.Millisecond, log,
		watch.Path{Name: cfg.SetsDir},
		watch.Path{Name: filepath.Join(cfg.SetsDir, pinset.ClusterSubdir)},
		watch.Path{Name: cfg.Node.LabelsFile},
		watch.Path{Name: cfg.CRIO.Config},
		watch.Path{Name: cfg.CRIO.ConfigDir, Recursive: true},
		watch.Path{Name: cfg.CRI.PullSecret},
		watch.Path{Name: cfg.Disk.KubeletConfig},
		watch.Path{Name: cfg.Kubelet.ConfigDir, Recursive: true},
		watch.Path{Name: cfg.CRISocket()},
		// A seed recorded or removed (imagepinctl seed, the seed directory's watch) and the
		// seed directory's media faults are the node's status.
		watch.Path{Name: seed.Dir(cfg.StateDir)},
	)
}

// Metrics are imagepind's metrics; with [peers] on (node not nil) the mirror's and the
// peers' byte counts too.
func Metrics(node *peers.Node) *metrics.Metrics {
	m := metrics.New()
	if node != nil {
		m.MirrorBytes(node.Served.FromStore.Load, node.Served.Transferred.Load)
		m.PeerBytes(node.Bytes.FromRegistry.Load, node.Bytes.FromPeers.Load, node.Bytes.ToPeers.Load)
	}
	return m
}

// Reporter reports the node's status to [report] aggregator (nil without one); the
// aggregator's answers carry the peers (the nodes that pin the same sets), which go to
// node ([peers]; nil: off), and the count of the holders of the sets' blobs, kept by
// the reporter (agent.HolderCounts), each change of which calls onHolders (nil: none).
func Reporter(cfg conf.Config, node *peers.Node, onHolders func(), log logrus.FieldLogger) *report.Reporter {
	if cfg.Report.Aggregator == "" {
		return nil
	}
	return report.New(report.Config{Aggregator: cfg.Report.Aggregator, Heartbeat: cfg.Report.Heartbeat.D(),
		CertFile: cfg.Report.Cert, KeyFile: cfg.Report.Key, CAFile: cfg.Report.CA, ServerName: cfg.Report.ServerName, OnPeers: node.FromAggregator, OnHolders: onHolders}, log)
}

// DaemonPublish is where each new status of imagepind goes, in this order: the status
// file, systemd's STATUS= (notify, the one-line summary), the metrics, the aggregator
// (reporter; nil: none), the Node condition (condition; nil: none). With [peers] on
// (node not nil) each status is stamped with the node's blob bytes first.
func DaemonPublish(cfg conf.Config, notify func(summary string), m *metrics.Metrics, reporter *report.Reporter,
	condition *nodecondition.Writer, node *peers.Node, log logrus.FieldLogger) func(status.Node) {
	pubs := []Publisher{
		StatusFile(cfg.StatusFile, log),
		func(n status.Node) { notify(n.Summary()) },
		m.Sets,
	}
	if reporter != nil {
		pubs = append(pubs, reporter.Update)
	}
	if condition != nil {
		pubs = append(pubs, condition.Update)
	}
	publish := Publish(pubs...)
	if node != nil {
		publish = node.Stamp(publish)
	}
	return publish
}
