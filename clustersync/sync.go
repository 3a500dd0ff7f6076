package clustersync

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"

	"github.com/imagepin/imagepin/api/v1alpha1"
	"github.com/imagepin/imagepin/pinset"
	fswatch "github.com/imagepin/imagepin/watch"
)

// NodesResource is the core Nodes resource.
var NodesResource = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

// Config says where the node's share of the API goes.
type Config struct {
	NodeName string
	// SetsDir is the sets directory; the sets go to its cluster subdirectory.
	SetsDir string
	// LabelsFile receives the Node's labels (a JSON object).
	LabelsFile string
	// OnFaults is called after Faults changes, so the node's status follows.
	OnFaults func()
	// OnSynced is called once, when Synced turns true (nil: not called).
	OnSynced func()
	Log      logrus.FieldLogger
	// Debounce batches bursts of events (the first list of many sets) into one write.
	Debounce time.Duration
	// ConnectRetry is how often a failing Connect is tried again (0: 5 s).
	ConnectRetry time.Duration
	// ProbeEvery is how often the API is asked whether it answers again while the
	// sync is faulted (0: 2 s).
	ProbeEvery time.Duration
}

// Connect builds the two API clients: the sets' dynamic client and the Node's metadata
// client. It is called until it succeeds (a kubeconfig that is not there yet, say).
type Connect func() (dynamic.Interface, metadata.Interface, error)

// Syncer keeps the cluster subdirectory and the labels file in step with the API.
type Syncer struct {
	cfg     Config
	connect Connect
	sets    dynamic.NamespaceableResourceInterface
	node    metadata.ResourceInterface

	// relist receives the source ("sets", "node") whose watch expired.
	relist chan string

	// synced: the first lists of the sets and of the Node have been written.
	synced atomic.Bool

	mu     sync.Mutex
	faults map[string]string // by source: "sets", "node", "write", "labels", "connect"
}

// New returns a syncer over the two clients; Run starts it.
func New(dyn dynamic.Interface, meta metadata.Interface, cfg Config) *Syncer {
	return NewConnecting(func() (dynamic.Interface, metadata.Interface, error) { return dyn, meta, nil }, cfg)
}

// NewConnecting returns a syncer that builds its clients in Run, and until that works
// (the kubeconfig missing at boot, before the kubelet wrote it) keeps the files as they
// are and reports a fault: the node's local set files are served meanwhile.
func NewConnecting(connect Connect, cfg Config) *Syncer {
	if cfg.Debounce <= 0 {
		cfg.Debounce = 100 * time.Millisecond
	}
	if cfg.ConnectRetry <= 0 {
		cfg.ConnectRetry = 5 * time.Second
	}
	if cfg.OnFaults == nil {
		cfg.OnFaults = func() {}
	}
	if cfg.ProbeEvery <= 0 {
		cfg.ProbeEvery = 2 * time.Second
	}
	return &Syncer{cfg: cfg, connect: connect, relist: make(chan string, 2), faults: map[string]string{}}
}

// connected builds the clients, retrying every ConnectRetry; false when ctx ended first.
func (s *Syncer) connected(ctx context.Context) bool {
	for {
		dyn, meta, err := s.connect()
		if err == nil {
			s.sets = dyn.Resource(v1alpha1.GroupVersionResource)
			s.node = meta.Resource(NodesResource)
			s.setFault("connect", "")
			return true
		}
		s.setFault("connect", fmt.Sprintf("cluster API: %v: keeping the synced sets and labels, retrying every %s; local set files are served meanwhile", err, s.cfg.ConnectRetry))
		select {
		case <-ctx.Done():
			return false
		case <-time.After(s.cfg.ConnectRetry):
		}
	}
}

// Synced says whether the first lists of the sets and of the Node have been written
// (OnSynced is called when it turns true, so the node's status follows); until then
// the sets directory may lack sets that target the node.
func (s *Syncer) Synced() bool { return s.synced.Load() }

// Dir is the cluster subdirectory of the sets directory.
func (s *Syncer) Dir() string { return filepath.Join(s.cfg.SetsDir, pinset.ClusterSubdir) }

// Faults are the sync's current problems, for the node's status; none when in step.
func (s *Syncer) Faults() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.faults))
	for _, f := range s.faults {
		out = append(out, f)
	}
	sort.Strings(out)
	return out
}

func (s *Syncer) setFault(source, msg string) {
	s.mu.Lock()
	changed := s.faults[source] != msg
	if msg == "" {
		delete(s.faults, source)
	} else {
		s.faults[source] = msg
	}
	s.mu.Unlock()
	if changed {
		if msg != "" {
			s.cfg.Log.WithField("source", source).Warn(msg)
		} else {
			s.cfg.Log.WithField("source", source).Info("cluster sync in step again")
		}
		s.cfg.OnFaults()
	}
}

// Run watches the API and writes files until ctx ends. The API being unreachable is a
// fault, never an error: informers retry with backoff and resume where they were.
func (s *Syncer) Run(ctx context.Context) error {
	if !s.connected(ctx) {
		return nil
	}
	setsChanged := make(chan struct{}, 1)
	nodeChanged := make(chan struct{}, 1)
	sets := &informer{newInf: func() cache.SharedIndexInformer {
		return cache.NewSharedIndexInformer(s.setsListWatch(), &unstructured.Unstructured{}, 0, cache.Indexers{})
	}, changed: setsChanged}
	node := &informer{newInf: func() cache.SharedIndexInformer {
		return cache.NewSharedIndexInformer(s.nodeListWatch(), &metav1.PartialObjectMetadata{}, 0, cache.Indexers{})
	}, changed: nodeChanged}
	for _, inf := range []*informer{sets, node} {
		if err := inf.start(ctx); err != nil {
			return err
		}
		defer inf.stop()
	}
	// What the sync wrote is watched: a file or the whole cluster subdirectory removed or
	// changed behind its back (an rsync --delete of the sets directory, an rm -rf) is
	// written again from what the API holds, not left for the agent to unpin.
	owned := fswatch.New(s.cfg.Debounce, s.cfg.Log,
		fswatch.Path{Name: s.cfg.SetsDir}, fswatch.Path{Name: s.Dir()}, fswatch.Path{Name: s.cfg.LabelsFile})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := owned.Run(ctx); err != nil {
			s.cfg.Log.WithError(err).Warn("cluster sync: cannot watch its files; they are checked on API events only")
		}
	}()
	defer wg.Wait()

	// While the API is faulted it is probed every ProbeEvery; once it answers, both
	// informers start again at once. client-go's reflector otherwise waits out a backoff
	// grown during the outage (up to a minute) before it lists again.
	probe := time.NewTicker(s.cfg.ProbeEvery)
	defer probe.Stop()
	var lastProbeRestart time.Time

	// Each side is written once when its first list completes (an empty list fires no
	// event, so that is polled for) and then on its own events only.
	poll := time.NewTicker(200 * time.Millisecond)
	defer poll.Stop()
	setsWritten, nodeWritten, labelsIn := false, false, false
	for {
		setsDirty, nodeDirty := false, false
		select {
		case <-ctx.Done():
			return nil
		case <-setsChanged:
			setsDirty = true
		case <-nodeChanged:
			nodeDirty = true
		case <-poll.C:
		case <-owned.C():
			// Compared with what they should hold, so the sync's own writes end here.
			setsDirty, nodeDirty = true, true
		case source := <-s.relist:
			// A watch expired (410): the API is there, list now rather than after a backoff.
			s.cfg.Log.WithField("source", source).Info("cluster API: the watch expired (resourceVersion too old): relisting")
			if err := s.restart(ctx, map[string]*informer{"sets": sets, "node": node}[source]); err != nil {
				return err
			}
			continue
		case <-probe.C:
			// At most one restart a minute this way: a watch that keeps failing while
			// lists work must not become a list every probe.
			if !s.apiFaulted() || time.Since(lastProbeRestart) < time.Minute || !s.probe(ctx) {
				continue
			}
			lastProbeRestart = time.Now()
			s.cfg.Log.Info("cluster API answers again: relisting now")
			for _, inf := range []*informer{sets, node} {
				if err := s.restart(ctx, inf); err != nil {
					return err
				}
			}
			continue
		}
		// Debounce: a burst of events (many sets in the first list) is one write.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(s.cfg.Debounce):
		}
		select {
		case <-setsChanged:
			setsDirty = true
		default:
		}
		select {
		case <-nodeChanged:
			nodeDirty = true
		default:
		}
		if sets.inf.HasSynced() && (setsDirty || !setsWritten) {
			// Not written (the sets directory missing, a write failing): polled again.
			setsWritten = s.writeSets(sets.inf.GetStore().List())
		}
		if node.inf.HasSynced() && (nodeDirty || !nodeWritten) {
			nodeWritten = true
			labelsIn = s.writeLabels(node.inf.GetStore().List())
		}
		// Synced once the sets and this Node's own labels are in (not before the Node
		// exists: with no labels, no set would seem to target it).
		if setsWritten && labelsIn && !s.synced.Swap(true) && s.cfg.OnSynced != nil {
			s.cfg.OnSynced()
		}
		if setsWritten && nodeWritten {
			poll.Stop()
		} else {
			poll.Reset(200 * time.Millisecond)
		}
	}
}
