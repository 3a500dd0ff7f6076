package clusterstatus

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/imagepin/imagepin/api/v1alpha1"
	"github.com/imagepin/imagepin/cluster/aggregator"
	"github.com/imagepin/imagepin/pinset"
)

var nodesResource = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

// Config bounds the loop's writes.
type Config struct {
	// Tick is how often targets and rollups are recomputed.
	Tick time.Duration
	// MinInterval: one set's status is written at most this often.
	MinInterval time.Duration
	// QPS and Burst bound status writes per second across all sets.
	QPS   float64
	Burst int
	// Warmup: a new leader writes nothing until every Node has reported, or this long.
	Warmup time.Duration
	Log    logrus.FieldLogger
	// Events, when set, takes an Event on a set whose status turns Ready or Degraded.
	Events record.EventRecorder
}

// Defaults: at most one write per set per 10 s and 5 per second in all, whatever the
// node count; a warm-up of 1.5 default heartbeats.
func (c *Config) defaults() {
	if c.Tick <= 0 {
		c.Tick = time.Second
	}
	if c.MinInterval <= 0 {
		c.MinInterval = 10 * time.Second
	}
	if c.QPS <= 0 {
		c.QPS = 5
	}
	if c.Burst <= 0 {
		c.Burst = 10
	}
	if c.Warmup <= 0 {
		c.Warmup = 45 * time.Second
	}
}

// Loop keeps the store's targets in step with the API and writes status when leading.
type Loop struct {
	cfg   Config
	store *aggregator.Store
	dyn   dynamic.NamespaceableResourceInterface

	setsInf, nodesInf cache.SharedIndexInformer
	started           chan struct{}

	mu      sync.Mutex
	parsed  map[types.UID]parsedSet // by uid, for the resourceVersion it was parsed at
	written map[types.UID]written
	writes  atomic.Int64
}

type parsedSet struct {
	resourceVersion string
	set             pinset.Set
	invalid         string
}

type written struct {
	status []byte
	at     time.Time
}

// New builds the loop; Run starts its informers.
func New(dyn dynamic.Interface, meta metadata.Interface, store *aggregator.Store, cfg Config) *Loop {
	cfg.defaults()
	dynFactory := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	metaFactory := metadatainformer.NewSharedInformerFactory(meta, 0)
	return &Loop{
		cfg: cfg, store: store, dyn: dyn.Resource(v1alpha1.GroupVersionResource),
		setsInf:  dynFactory.ForResource(v1alpha1.GroupVersionResource).Informer(),
		nodesInf: metaFactory.ForResource(nodesResource).Informer(),
		started:  make(chan struct{}),
		parsed:   map[types.UID]parsedSet{}, written: map[types.UID]written{},
	}
}

// Writes counts status writes so far.
func (l *Loop) Writes() int64 { return l.writes.Load() }

// Run runs the informers and recomputes the targets every Tick until ctx ends. Both
// replicas run it: the standby's JSON API stays right and a takeover starts warm.
func (l *Loop) Run(ctx context.Context) error {
	go l.setsInf.RunWithContext(ctx)
	go l.nodesInf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), l.setsInf.HasSynced, l.nodesInf.HasSynced) {
		return nil
	}
	l.cfg.Log.WithField("sets", len(l.setsInf.GetStore().ListKeys())).WithField("nodes", len(l.nodesInf.GetStore().ListKeys())).Info("cluster API in sync")
	l.refresh()
	close(l.started)
	t := time.NewTicker(l.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			l.refresh()
		}
	}
}

// refresh parses changed sets and hands every set's targets to the store.
func (l *Loop) refresh() {
	nodes := l.nodesInf.GetStore().List()
	targets := map[string]aggregator.Target{}
	seen := map[types.UID]bool{}
	for _, o := range l.setsInf.GetStore().List() {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		p := l.parse(u)
		seen[u.GetUID()] = true
		t := aggregator.Target{SpecHash: p.set.SpecHash, File: pinset.ClusterFile(u.GetName())}
		if p.invalid == "" {
			for _, n := range nodes {
				if m, ok := n.(*metav1.PartialObjectMetadata); ok && p.set.Selector.Matches(m.Labels) {
					t.Nodes = append(t.Nodes, m.Name)
				}
			}
		}
		targets[u.GetName()] = t
	}
	l.mu.Lock()
	for uid := range l.parsed {
		if !seen[uid] {
			delete(l.parsed, uid)
			delete(l.written, uid)
		}
	}
	l.mu.Unlock()
	l.store.SetTargets(targets)
	// A Node deleted from the API is forgotten once it has gone silent too.
	names := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		if m, ok := n.(*metav1.PartialObjectMetadata); ok {
			names[m.Name] = true
		}
	}
	if gone := l.store.Forget(0, names); len(gone) > 0 {
		l.cfg.Log.WithField("nodes", gone).Info("forgot nodes deleted from the cluster")
	}
}

// parse reads an object exactly as a node reads its file; cached per resourceVersion.
func (l *Loop) parse(u *unstructured.Unstructured) parsedSet {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p, ok := l.parsed[u.GetUID()]; ok && p.resourceVersion == u.GetResourceVersion() {
		return p
	}
	p := parsedSet{resourceVersion: u.GetResourceVersion()}
	doc, err := v1alpha1.NodeDocument(u)
	if err == nil {
		var res pinset.ParseResult
		res, err = pinset.ParseSetFile(pinset.ClusterFile(u.GetName()), doc)
		if err == nil && len(res.Sets) == 1 {
			p.set = res.Sets[0]
		}
	}
	if err != nil {
		p.invalid = err.Error()
	}
	l.parsed[u.GetUID()] = p
	return p
}

// Lead writes status while ctx (the leadership) lasts.
func (l *Loop) Lead(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-l.started:
	}
	l.warmUp(ctx)
	limiter := rate.NewLimiter(rate.Limit(l.cfg.QPS), l.cfg.Burst)
	t := time.NewTicker(l.cfg.Tick)
	defer t.Stop()
	for {
		l.writeAll(ctx, limiter)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// warmUp waits until every Node has reported or Warmup passed: the reports of the old
// leader's nodes arrive within a heartbeat, and until then "Unknown" would be false.
func (l *Loop) warmUp(ctx context.Context) {
	deadline := time.Now().Add(l.cfg.Warmup)
	for time.Now().Before(deadline) {
		missing := 0
		for _, n := range l.nodesInf.GetStore().List() {
			if m, ok := n.(*metav1.PartialObjectMetadata); ok && !l.store.Reported(m.Name) {
				missing++
			}
		}
		if missing == 0 {
			l.cfg.Log.Info("every Node has reported: writing status")
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(l.cfg.Tick):
		}
	}
	l.cfg.Log.WithField("warmup", l.cfg.Warmup).Info("warm-up over: writing status (nodes that have not reported count as Unknown)")
}

func (l *Loop) writeAll(ctx context.Context, limiter *rate.Limiter) {
	now := time.Now()
	for _, o := range l.setsInf.GetStore().List() {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		uid := u.GetUID()
		l.mu.Lock()
		last, wroteBefore := l.written[uid]
		l.mu.Unlock()
		if wroteBefore && now.Sub(last.at) < l.cfg.MinInterval {
			continue
		}
		cur := currentStatus(u)
		view, _ := l.store.Set(u.GetName(), false)
		p := l.parse(u)
		st := BuildStatus(u.GetGeneration(), view, p.invalid, cur.Conditions, now)
		data, err := json.Marshal(st)
		if err != nil {
			continue
		}
		// Unchanged from what the object holds (after a takeover, what the old leader wrote).
		if old, err := json.Marshal(cur); err == nil && bytes.Equal(old, data) {
			continue
		}
		if wroteBefore && bytes.Equal(last.status, data) {
			continue // the informer has not seen our write yet
		}
		if !limiter.Allow() {
			return // the rest on a later tick
		}
		patch, _ := json.Marshal(map[string]any{"status": json.RawMessage(data)})
		if _, err := l.dyn.Patch(ctx, u.GetName(), types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "imagepin-aggregator"}, "status"); err != nil {
			l.cfg.Log.WithError(err).WithField("set", u.GetName()).Warn("status write failed; retried on a later tick")
			continue
		}
		l.writes.Add(1)
		l.recordEvents(u, cur, st)
		l.mu.Lock()
		l.written[uid] = written{status: data, at: now}
		l.mu.Unlock()
		l.cfg.Log.WithField("set", u.GetName()).WithField("nodes", st.Nodes).Debug("status written")
	}
}

// Event reasons on a PinnedImageSet.
const (
	EventReady    = "SetReady"
	EventDegraded = "SetDegraded"
)

// recordEvents takes an Event for each of Ready and Degraded that turned True with this
// write (client-go's correlator aggregates repeats and rate-limits each object's).
func (l *Loop) recordEvents(u *unstructured.Unstructured, old, cur v1alpha1.Status) {
	if l.cfg.Events == nil {
		return
	}
	ref := &corev1.ObjectReference{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind, Name: u.GetName(), UID: u.GetUID()}
	for _, e := range []struct{ condition, reason, kind string }{
		{v1alpha1.ConditionReady, EventReady, corev1.EventTypeNormal},
		{v1alpha1.ConditionDegraded, EventDegraded, corev1.EventTypeWarning},
	} {
		now := meta.FindStatusCondition(cur.Conditions, e.condition)
		before := meta.FindStatusCondition(old.Conditions, e.condition)
		if now != nil && now.Status == metav1.ConditionTrue && (before == nil || before.Status != metav1.ConditionTrue) {
			l.cfg.Events.Event(ref, e.kind, e.reason, fmt.Sprintf("%s (nodes %s): %s", now.Reason, cur.Nodes, now.Message))
		}
	}
}

// currentStatus is the object's status as our type, for comparison and transition times.
func currentStatus(u *unstructured.Unstructured) v1alpha1.Status {
	var st v1alpha1.Status
	if m, ok := u.Object["status"].(map[string]any); ok {
		_ = runtime.DefaultUnstructuredConverter.FromUnstructured(m, &st)
	}
	return st
}

// String describes the loop's bounds, for the log.
func (c Config) String() string {
	return fmt.Sprintf("min-interval=%s qps=%g burst=%d warmup=%s", c.MinInterval, c.QPS, c.Burst, c.Warmup)
}
