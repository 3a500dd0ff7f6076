// Package metrics exposes imagepind's Prometheus metrics: per set (images total and
// ready, bytes ready, phase), pulls by result, pull durations, the pull width, reloads
// by result, and the time of the last reconcile. The registry is the caller's, never the global one.
package metrics

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/imagepin/imagepin/internal/httpserve"
	"github.com/imagepin/imagepin/status"
)

// Metrics holds imagepind's collectors.
type Metrics struct {
	reg           *prometheus.Registry
	setImages     *prometheus.GaugeVec
	setReady      *prometheus.GaugeVec
	setBytesReady *prometheus.GaugeVec
	setPhase      *prometheus.GaugeVec
	pulls         *prometheus.CounterVec
	pullDuration  *prometheus.HistogramVec
	reloads       *prometheus.CounterVec
	lastReconcile prometheus.Gauge
	pullWidth     prometheus.Gauge
	tags          *prometheus.GaugeVec
}

// New registers the collectors on a new registry.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		setImages: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "imagepin_set_images",
			Help: "Images listed by a set that applies to this node."}, []string{"set"}),
		setReady: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "imagepin_set_images_ready",
			Help: "Images of a set present and pinned."}, []string{"set"}),
		setBytesReady: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "imagepin_set_bytes_ready",
			Help: "Compressed layer bytes of a set's ready images (0 while the disk check is a stub)."}, []string{"set"}),
		setPhase: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "imagepin_set_phase",
			Help: "1 for the set's current phase, 0 for the others."}, []string{"set", "phase"}),
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "imagepin_pulls_total",
			Help: "Image pulls by result: success, transient, unavailable, no_space."}, []string{"result"}),
		pullDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "imagepin_pull_duration_seconds",
			Help: "Duration of image pulls.", Buckets: prometheus.ExponentialBuckets(0.05, 2, 16)}, []string{"result"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "imagepin_reloads_total",
			Help: "CRI-O reloads by result: confirmed, failed."}, []string{"result"}),
		lastReconcile: prometheus.NewGauge(prometheus.GaugeOpts{Name: "imagepin_last_reconcile_timestamp_seconds",
			Help: "Unix time of the last reconcile."}),
		pullWidth: prometheus.NewGauge(prometheus.GaugeOpts{Name: "imagepin_pull_width",
			Help: "How many pulls may run at once now (found as pulls go, at most pull_concurrency)."}),
		tags: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "imagepin_tags",
			Help: "Tags the sets pin (repo:tag@sha256:…), by state: pinned (all), held (the runtime knows them as the pinned digest), moved (their registry names another digest now)."}, []string{"state"}),
	}
	m.reg.MustRegister(m.setImages, m.setReady, m.setBytesReady, m.setPhase, m.pulls, m.pullDuration, m.reloads, m.lastReconcile, m.pullWidth, m.tags,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Pull records a finished pull.
func (m *Metrics) Pull(result string, d time.Duration) {
	m.pulls.WithLabelValues(result).Inc()
	m.pullDuration.WithLabelValues(result).Observe(d.Seconds())
}

// Reload records a reload and its confirmation.
func (m *Metrics) Reload(result string) { m.reloads.WithLabelValues(result).Inc() }

// Width records how many pulls may run at once.
func (m *Metrics) Width(n int) { m.pullWidth.Set(float64(n)) }

// Reconciled records a reconcile.
func (m *Metrics) Reconciled(t time.Time) { m.lastReconcile.Set(float64(t.UnixNano()) / 1e9) }

// Sets replaces the per-set gauges (and the tags') with the node status.
func (m *Metrics) Sets(n status.Node) {
	var pinned, held, moved int
	if t := n.Tags; t != nil {
		pinned, held, moved = t.Pinned, t.Held, len(t.Moved)
	}
	m.tags.WithLabelValues("pinned").Set(float64(pinned))
	m.tags.WithLabelValues("held").Set(float64(held))
	m.tags.WithLabelValues("moved").Set(float64(moved))
	m.setImages.Reset()
	m.setReady.Reset()
	m.setBytesReady.Reset()
	m.setPhase.Reset()
	for _, s := range n.Sets {
		m.setImages.WithLabelValues(s.Name).Set(float64(s.ImagesTotal))
		m.setReady.WithLabelValues(s.Name).Set(float64(s.ImagesReady))
		m.setBytesReady.WithLabelValues(s.Name).Set(float64(s.BytesReady))
		for _, p := range []status.Phase{status.Pending, status.Pulling, status.Ready, status.Failed} {
			v := 0.0
			if s.Phase == p {
				v = 1
			}
			m.setPhase.WithLabelValues(s.Name, string(p)).Set(v)
		}
	}
}

// Handler serves /metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Serve listens on address until ctx ends, then shuts the server down.
func (m *Metrics) Serve(ctx context.Context, address string) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	return httpserve.Run(ctx, address, mux)
}

// MirrorBytes exposes the node-local mirror's bytes served to the runtime ([peers]), by
// where they came from: the node's store, or a transfer (served while it arrived from
// the registry or a peer).
func (m *Metrics) MirrorBytes(fromStore, transferred func() int64) {
	for from, f := range map[string]func() int64{"store": fromStore, "transfer": transferred} {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "imagepin_mirror_served_bytes_total",
			Help:        "Bytes the node-local mirror served to the runtime, by where they came from: store or transfer.",
			ConstLabels: prometheus.Labels{"from": from}}, func() float64 { return float64(f()) }))
	}
}

// PeerBytes exposes a node's blob bytes ([peers]): fetched from registries (for itself
// or a peer), read from peers, served to peers.
func (m *Metrics) PeerBytes(fromRegistry, fromPeers, toPeers func() int64) {
	for dir, f := range map[string]func() int64{"from_registry": fromRegistry, "from_peers": fromPeers, "to_peers": toPeers} {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "imagepin_peer_bytes_total",
			Help:        "Bytes of pinned images' manifests and blobs by direction: from_registry, from_peers, to_peers.",
			ConstLabels: prometheus.Labels{"direction": dir}}, func() float64 { return float64(f()) }))
	}
}
