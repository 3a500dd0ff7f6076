package aggregator

import (
	"github.com/prometheus/client_golang/prometheus"
)

// collector computes the metrics from a rollup at scrape time: no second copy of state.
type collector struct{ store *Store }

var (
	descSetNodes = prometheus.NewDesc("imagepin_aggregator_set_nodes", "Nodes targeted by a set, by state (ready, failed, progressing, unknown).",
		[]string{"set", "state"}, nil)
	descSetReady       = prometheus.NewDesc("imagepin_aggregator_set_ready", "1 when every targeted node is Ready and none is Unknown.", []string{"set"}, nil)
	descSetImagesReady = prometheus.NewDesc("imagepin_aggregator_set_images_ready", "Images ready, summed over targeted nodes.", []string{"set"}, nil)
	descSetBytesReady  = prometheus.NewDesc("imagepin_aggregator_set_bytes_ready", "Compressed bytes ready, summed over targeted nodes.", []string{"set"}, nil)
	// RegistryIndependent per set, its parts apart: the nodes where it is True, the Ready
	// nodes where pods would need the registry when they start (or cannot tell), and the
	// blobs too few nodes hold for a node to join or be replaced without it.
	descSetRegistryIndependent = prometheus.NewDesc("imagepin_aggregator_set_registry_independent_nodes",
		"Nodes where pods start from the set's images with the registry gone and every blob had 2 holders (RegistryIndependent True).", []string{"set"}, nil)
	descSetRegistryDependent = prometheus.NewDesc("imagepin_aggregator_set_registry_dependent_nodes",
		"Ready nodes of the set where pods would need the registry when they start, or that cannot tell (PodsStartWithoutRegistry not True).", []string{"set"}, nil)
	descSetBlobsShort = prometheus.NewDesc("imagepin_aggregator_set_blobs_short",
		"Blobs of the set's images held by fewer than 2 nodes: a node joining or replacing one would need the registry for them.", []string{"set"}, nil)
	descSetImagesUnheld = prometheus.NewDesc("imagepin_aggregator_set_images_unheld",
		"Images of the set that no node sharing blobs pins: a node joining would find none of their blobs.", []string{"set"}, nil)
	descNodeAge = prometheus.NewDesc("imagepin_aggregator_node_report_age_seconds", "Seconds since the node's last report.", []string{"node"}, nil)
)

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSetNodes, descSetReady, descSetImagesReady, descSetBytesReady, descSetRegistryIndependent, descSetRegistryDependent, descSetBlobsShort, descSetImagesUnheld, descNodeAge} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.store.SetsSummary() {
		for state, n := range map[string]int{"ready": s.ReadyNodes, "failed": s.FailedNodes, "progressing": s.ProgressingNodes, "unknown": s.UnknownNodes} {
			ch <- prometheus.MustNewConstMetric(descSetNodes, prometheus.GaugeValue, float64(n), s.Name, state)
		}
		ready := 0.0
		if s.Ready {
			ready = 1
		}
		ch <- prometheus.MustNewConstMetric(descSetReady, prometheus.GaugeValue, ready, s.Name)
		ch <- prometheus.MustNewConstMetric(descSetImagesReady, prometheus.GaugeValue, float64(s.ImagesReady), s.Name)
		ch <- prometheus.MustNewConstMetric(descSetBytesReady, prometheus.GaugeValue, float64(s.BytesReady), s.Name)
		ch <- prometheus.MustNewConstMetric(descSetRegistryIndependent, prometheus.GaugeValue, float64(s.RegistryIndependentNodes), s.Name)
		ch <- prometheus.MustNewConstMetric(descSetRegistryDependent, prometheus.GaugeValue, float64(s.RegistryDependentNodes), s.Name)
		ch <- prometheus.MustNewConstMetric(descSetBlobsShort, prometheus.GaugeValue, float64(s.BlobHolders.ShortCount), s.Name)
		ch <- prometheus.MustNewConstMetric(descSetImagesUnheld, prometheus.GaugeValue, float64(s.BlobHolders.NoHolderCount), s.Name)
	}
	for _, n := range c.store.Nodes() {
		if n.NeverReported {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descNodeAge, prometheus.GaugeValue, n.AgeSeconds, n.Name)
	}
}
