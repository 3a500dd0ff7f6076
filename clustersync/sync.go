package clustersync

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"

	"github.com/imagepin/imagepin/api/v1alpha1"
	"github.com/imagepin/imagepin/internal/fsutil"
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
	setsWritten, nodeWritten := false, false
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
			s.writeLabels(node.inf.GetStore().List())
		}
		if setsWritten && nodeWritten {
			poll.Stop()
		} else {
			poll.Reset(200 * time.Millisecond)
		}
	}
}

// informer is one informer that can be started again: a new one lists at once, with a
// fresh backoff, while the files stay as they are until it has listed.
type informer struct {
	newInf  func() cache.SharedIndexInformer
	changed chan struct{}

	inf    cache.SharedIndexInformer
	cancel context.CancelFunc
	done   chan struct{}
}

func (i *informer) start(ctx context.Context) error {
	i.inf = i.newInf()
	poke := func() {
		select {
		case i.changed <- struct{}{}:
		default:
		}
	}
	if _, err := i.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	}); err != nil {
		return err
	}
	ictx, cancel := context.WithCancel(ctx)
	i.cancel, i.done = cancel, make(chan struct{})
	go func() { defer close(i.done); i.inf.RunWithContext(ictx) }()
	return nil
}

func (i *informer) stop() {
	if i.cancel != nil {
		i.cancel()
		<-i.done
		i.cancel = nil
	}
}

// restart replaces an informer with a new one.
func (s *Syncer) restart(ctx context.Context, i *informer) error {
	i.stop()
	return i.start(ctx)
}

// apiFaulted says whether a list or watch of the API is failing now.
func (s *Syncer) apiFaulted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults["sets"] != "" || s.faults["node"] != ""
}

// probe asks the API for one set, briefly: does it answer?
func (s *Syncer) probe(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := s.sets.List(ctx, metav1.ListOptions{Limit: 1})
	return err == nil
}

// tracked records the outcome of every list and watch call: an error is a fault, a
// success clears it.
func (s *Syncer) tracked(source, what, keep string, list cache.ListWithContextFunc, w cache.WatchFuncWithContext) *cache.ListWatch {
	record := func(err error) {
		if err == nil {
			s.setFault(source, "")
			return
		}
		if errors.Is(err, context.Canceled) {
			return
		}
		s.setFault(source, fmt.Sprintf("cluster API: %s: %v: %s", what, err, keep))
	}
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			obj, err := list(ctx, o)
			record(err)
			return obj, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			wi, err := w(ctx, o)
			if err != nil {
				record(err)
				return nil, err
			}
			// client-go turns an EOF (an API server behind a load balancer that is gone)
			// into an empty, successful watch: a watch is healthy only once it delivers an
			// event or stays open. An ERROR event is the API answering: a 410 (the
			// resourceVersion expired, as after an API server restart) is relisted at
			// once; another status is a fault that says what the API said.
			return newHealthyWatch(wi, func(h watchHealth, status error) {
				switch {
				case h == watchHealthy:
					record(nil)
				case h == watchErrored && (apierrors.IsResourceExpired(status) || apierrors.IsGone(status)):
					record(nil)
					select {
					case s.relist <- source:
					default:
					}
				case h == watchErrored:
					record(fmt.Errorf("the watch failed: %w", status))
				default:
					record(errors.New("the watch closed at once with no event (API server unreachable behind a load balancer?)"))
				}
			}), nil
		},
	}
}

// healthyAfter is how long a watch must stay open to count as a working API.
const healthyAfter = 2 * time.Second

type healthyWatch struct {
	inner watch.Interface
	out   chan watch.Event
	stop  chan struct{}
	once  sync.Once
}

// watchHealth is what a watch showed of the API.
type watchHealth int

const (
	// watchHealthy: it delivered an event or stayed open for healthyAfter.
	watchHealthy watchHealth = iota
	// watchErrored: its first event was an ERROR (a status from the API).
	watchErrored
	// watchClosedEmpty: it closed before either.
	watchClosedEmpty
)

// newHealthyWatch calls health once: healthy once the watch delivers an event or stays
// open for healthyAfter, errored with the status of an ERROR event that comes first, or
// closed-empty if it closes before any of these.
func newHealthyWatch(inner watch.Interface, health func(watchHealth, error)) watch.Interface {
	h := &healthyWatch{inner: inner, out: make(chan watch.Event), stop: make(chan struct{})}
	go func() {
		defer close(h.out)
		timer := time.NewTimer(healthyAfter)
		defer timer.Stop()
		in := inner.ResultChan()
		told := false
		tell := func(v watchHealth, err error) {
			if !told {
				told = true
				health(v, err)
			}
		}
		for {
			select {
			case <-h.stop:
				return
			case <-timer.C:
				tell(watchHealthy, nil)
			case ev, ok := <-in:
				if !ok {
					tell(watchClosedEmpty, nil)
					return
				}
				if ev.Type == watch.Error {
					tell(watchErrored, apierrors.FromObject(ev.Object))
				} else {
					tell(watchHealthy, nil)
				}
				select {
				case h.out <- ev:
				case <-h.stop:
					return
				}
			}
		}
	}()
	return h
}

func (h *healthyWatch) ResultChan() <-chan watch.Event { return h.out }

func (h *healthyWatch) Stop() {
	h.once.Do(func() { close(h.stop) })
	h.inner.Stop()
}

func (s *Syncer) setsListWatch() *cache.ListWatch {
	return s.tracked("sets", "list/watch PinnedImageSets", "keeping the synced sets; nothing is unpinned",
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return s.sets.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return s.sets.Watch(ctx, o) })
}

func (s *Syncer) nodeListWatch() *cache.ListWatch {
	selector := fields.OneTermEqualSelector("metadata.name", s.cfg.NodeName).String()
	return s.tracked("node", "list/watch Node "+s.cfg.NodeName, "keeping the last labels",
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return s.node.List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return s.node.Watch(ctx, o)
		})
}

// writeSets makes the cluster subdirectory hold exactly the objects: changed files are
// replaced atomically, files of deleted objects removed (the agent unpins them after
// unpin_delay). A missing sets directory is a sync fault of its own: nothing is created
// in its place, so the agent keeps seeing the fault rather than an empty directory. It
// says whether the directory is in step.
func (s *Syncer) writeSets(objs []any) bool {
	if st, err := os.Stat(s.cfg.SetsDir); err != nil || !st.IsDir() {
		s.setFault("write", fmt.Sprintf("cluster sync: sets directory %s is missing: not writing cluster sets", s.cfg.SetsDir))
		return false
	}
	dir := s.Dir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		s.setFault("write", fmt.Sprintf("cluster sync: %v", err))
		return false
	}
	want := map[string][]byte{}
	var problems []string
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		name := u.GetName()
		if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
			problems = append(problems, fmt.Sprintf("PinnedImageSet %q: metadata.name: %s", name, strings.Join(msgs, "; ")))
			continue
		}
		data, err := v1alpha1.NodeDocument(u)
		if err != nil {
			problems = append(problems, fmt.Sprintf("PinnedImageSet %s: %v", name, err))
			continue
		}
		want[pinset.ClusterFileName(name)] = data
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		s.setFault("write", fmt.Sprintf("cluster sync: %v", err))
		return false
	}
	have := map[string]bool{}
	for _, e := range entries {
		n := e.Name()
		switch {
		case strings.HasPrefix(n, ".") && strings.Contains(n, ".tmp-"):
			_ = os.Remove(filepath.Join(dir, n)) // a temp file left by a kill -9
		case pinset.IsSetFileName(n) && want[n] == nil:
			if err := fsutil.RemoveDurable(filepath.Join(dir, n)); err != nil {
				problems = append(problems, err.Error())
			} else {
				s.cfg.Log.WithField("file", pinset.ClusterSubdir+"/"+n).Info("set deleted in the API: file removed")
			}
		default:
			have[n] = true
		}
	}
	for n, data := range want {
		p := filepath.Join(dir, n)
		if have[n] {
			if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, data) {
				continue
			}
		}
		if err := fsutil.WriteAtomic(p, "", data, 0o644); err != nil {
			problems = append(problems, err.Error())
			continue
		}
		s.cfg.Log.WithField("file", pinset.ClusterSubdir+"/"+n).Info("set from the API written")
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		s.setFault("write", "cluster sync: "+strings.Join(problems, "; "))
		return false
	}
	s.setFault("write", "")
	return true
}

// writeLabels writes the Node's labels to the labels file when they change. No Node of
// this name keeps the last labels and says how to fix it.
func (s *Syncer) writeLabels(objs []any) {
	var node *metav1.PartialObjectMetadata
	for _, o := range objs {
		if m, ok := o.(*metav1.PartialObjectMetadata); ok && m.Name == s.cfg.NodeName {
			node = m
		}
	}
	if node == nil {
		s.setFault("labels", fmt.Sprintf("cluster API: no Node named %q: keeping the last labels (set [node] name to the kubelet's node name)", s.cfg.NodeName))
		return
	}
	labels := node.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	data, err := json.MarshalIndent(labels, "", "  ")
	if err != nil {
		s.setFault("labels", err.Error())
		return
	}
	data = append(data, '\n')
	if old, err := os.ReadFile(s.cfg.LabelsFile); err == nil && bytes.Equal(old, data) {
		s.setFault("labels", "")
		return
	}
	if err := os.MkdirAll(filepath.Dir(s.cfg.LabelsFile), 0o755); err != nil {
		s.setFault("labels", fmt.Sprintf("cluster sync: labels file: %v", err))
		return
	}
	if err := fsutil.WriteAtomic(s.cfg.LabelsFile, "", data, 0o644); err != nil {
		s.setFault("labels", fmt.Sprintf("cluster sync: labels file: %v", err))
		return
	}
	s.cfg.Log.WithField("file", s.cfg.LabelsFile).Info("node labels from the API written")
	s.setFault("labels", "")
}
