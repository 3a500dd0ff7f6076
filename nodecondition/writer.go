package nodecondition

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/imagepin/imagepin/status"
)

// Event reasons on the Node.
const (
	EventReady    = "PinnedImagesReady"
	EventNotReady = "PinnedImagesNotReady"
)

// Config bounds the writer.
type Config struct {
	NodeName string
	Mode     Mode
	// Heartbeat: an unchanged condition is written again this often, its
	// lastHeartbeatTime saying imagepind still evaluates it (0: 5 min).
	Heartbeat time.Duration
	// MinInterval: writes are at most this often; changes in between are coalesced
	// into the latest (0: 2 s). A change of status is written at once unless the status
	// changed less than MinInterval ago (a write of the message alone does not hold it
	// back).
	MinInterval time.Duration
	// RetryMax caps the backoff after failed writes, which starts at MinInterval and
	// doubles (0: 2 min).
	RetryMax time.Duration
	// Timeout bounds one API call (0: 30 s).
	Timeout time.Duration
	// StartupGrace: a True condition found on the Node at start stays while the sets
	// only wait (Pending, Pulling: a restarted imagepind confirming its pins), for at
	// most this long; a Failed set is written at once (0: 1 min).
	StartupGrace time.Duration
	// JoinWait: a Node not registered yet (or the kubelet's kubeconfig not written yet)
	// is asked for every MinInterval for this long, then backed off as an outage, with a
	// warning (0: 10 min).
	JoinWait time.Duration
	Log      logrus.FieldLogger
	Clock    clock.Clock
}

func (c *Config) defaults() {
	if c.Heartbeat <= 0 {
		c.Heartbeat = 5 * time.Minute
	}
	if c.MinInterval <= 0 {
		c.MinInterval = 2 * time.Second
	}
	if c.RetryMax <= 0 {
		c.RetryMax = 2 * time.Minute
	}
	if c.Timeout <= 0 {
		c.Timeout = 30 * time.Second
	}
	if c.StartupGrace <= 0 {
		c.StartupGrace = time.Minute
	}
	if c.JoinWait <= 0 {
		c.JoinWait = 10 * time.Minute
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Log == nil {
		c.Log = logrus.StandardLogger()
	}
}

// Connect builds the client, with the node's own credentials; it is called until it
// succeeds (the kubelet's kubeconfig may not be written yet at boot).
type Connect func() (kubernetes.Interface, error)

// Writer publishes the condition on the node's own Node object.
type Writer struct {
	cfg     Config
	connect Connect
	// newRecorder builds the event recorder on the client (nil: a broadcaster to the
	// API, with client-go's spam filter).
	newRecorder func(kubernetes.Interface) (record.EventRecorder, func())

	mu     sync.Mutex
	want   *Condition
	gen    int64 // counts Updates that changed want
	poke   chan struct{}
	writes atomic.Int64
	// waitingOn: the last gen Run acted on before it waited (tests wait for it to
	// catch up before they move a fake clock).
	waitingOn atomic.Int64
}

// New returns a writer; Update feeds it, Run writes.
func New(cfg Config, connect Connect) *Writer {
	cfg.defaults()
	return &Writer{cfg: cfg, connect: connect, poke: make(chan struct{}, 1)}
}

// Update takes a new node status (a wire.Publisher); it never blocks.
func (w *Writer) Update(n status.Node) {
	c, ok := Compute(n, w.cfg.Mode)
	if !ok {
		return
	}
	w.mu.Lock()
	w.want = &c
	w.gen++
	w.mu.Unlock()
	select {
	case w.poke <- struct{}{}:
	default:
	}
}

// Writes counts successful writes.
func (w *Writer) Writes() int64 { return w.writes.Load() }

func (w *Writer) current() (*Condition, int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.want, w.gen
}

// state is what Run knows of the API's side; only Run's goroutine touches it.
type state struct {
	client   kubernetes.Interface
	recorder record.EventRecorder
	stop     func()
	ref      *corev1.ObjectReference
	read     bool       // the Node's condition read once (its transition time kept)
	inAPI    *Condition // what the API holds of ours, as last written or read
	since    time.Time  // lastTransitionTime of inAPI's status
	at       time.Time  // last successful write
	tried    time.Time  // last attempt
	flipped  time.Time  // last successful write that changed the status (True ↔ False)
	failures int
	started  time.Time
	// held: a True condition found at start, kept through StartupGrace while sets wait.
	held bool
	// unregistered: the last attempt found no Node of this name (the kubelet has not
	// registered it yet), since unregisteredAt.
	unregistered   bool
	unregisteredAt time.Time
}

// errHeld: the write waits for the startup grace (not a failure).
var errHeld = errors.New("held for the startup grace")

// Run writes the condition until ctx ends: on a change (at most every MinInterval), and
// every Heartbeat unchanged. A failed write (the API unreachable, the Node not there
// yet) is retried with backoff, always with the latest condition. Run returns nil.
func (w *Writer) Run(ctx context.Context) error {
	s := state{started: w.cfg.Clock.Now()}
	defer func() {
		if s.stop != nil {
			s.stop()
		}
	}()
	for {
		var wait <-chan time.Time
		want, gen := w.current()
		if want != nil {
			now := w.cfg.Clock.Now()
			due := s.at.Add(w.cfg.Heartbeat)
			if s.inAPI == nil || *s.inAPI != *want {
				due = s.tried.Add(w.cfg.MinInterval)
				// A change of status (False to True: the startup taint waits for it) is
				// not held back by a write of the reason or message just before: it is
				// due MinInterval after the last change of status, so a flapping
				// condition is still written at most once every MinInterval.
				if s.inAPI != nil && s.inAPI.Status != want.Status {
					if flip := s.flipped.Add(w.cfg.MinInterval); flip.Before(due) {
						due = flip
					}
				}
			}
			if s.held && want.Reason == ReasonSetsNotReady {
				if end := s.started.Add(w.cfg.StartupGrace); end.After(due) {
					due = end
				}
			}
			if s.failures > 0 {
				if retry := s.tried.Add(w.backoff(s.failures)); retry.After(due) {
					due = retry
				}
			}
			if !now.Before(due) {
				s.tried = now
				err := w.write(ctx, &s, *want)
				// A joining node: its Node may appear any moment, and the startup taint
				// waits on this write. Asked again every MinInterval (a GET) for
				// JoinWait; after that it is more likely a name the kubelet does not
				// register under, said once as a warning and backed off as an outage.
				if notRegistered(err) {
					if !s.unregistered {
						s.unregisteredAt = now
						w.cfg.Log.WithError(err).WithField("node", w.cfg.NodeName).Info("node condition " + Type + ": waiting for the kubelet to register the Node; asking every " + w.cfg.MinInterval.String())
					}
					s.unregistered = true
					if now.Sub(s.unregisteredAt) < w.cfg.JoinWait {
						s.failures = 0
						continue
					}
					if s.failures == 0 {
						w.cfg.Log.WithError(err).WithField("node", w.cfg.NodeName).Warn("node condition " + Type + ": no Node of this name after " + w.cfg.JoinWait.String() +
							": does the kubelet register the node under another name (--hostname-override)? Set [node] name to the kubelet's node name; asking less often now")
					}
					s.failures++
					continue
				}
				if s.unregistered { // and no longer: the branch above continues
					if err == nil || errors.Is(err, errHeld) {
						w.cfg.Log.WithField("node", w.cfg.NodeName).Info("node condition " + Type + ": the Node is registered")
					}
					s.unregistered = false
				}
				if errors.Is(err, errHeld) {
					continue
				} else if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					s.failures++
					log := w.cfg.Log.WithError(err).WithField("node", w.cfg.NodeName).WithField("retry", w.backoff(s.failures))
					if s.failures == 1 {
						log.Warn("node condition " + Type + " not written; retrying")
					} else {
						log.Debug("node condition " + Type + " not written; retrying")
					}
				} else {
					if s.failures > 0 {
						w.cfg.Log.WithField("node", w.cfg.NodeName).WithField("failures", s.failures).Info("node condition " + Type + " written again")
					}
					s.failures = 0
				}
				continue
			}
			wait = w.cfg.Clock.After(due.Sub(now))
		}
		w.waitingOn.Store(gen)
		select {
		case <-ctx.Done():
			return nil
		case <-w.poke:
		case <-wait:
		}
	}
}

// notRegistered says the Node does not exist yet, or the kubelet's kubeconfig is not
// written yet: a node joining, imagepind up before its kubelet has bootstrapped and
// registered it. Not an outage.
func notRegistered(err error) bool {
	return err != nil && (apierrors.IsNotFound(err) || errors.Is(err, fs.ErrNotExist))
}

func (w *Writer) backoff(failures int) time.Duration {
	d := w.cfg.MinInterval
	for i := 1; i < failures && d < w.cfg.RetryMax; i++ {
		d *= 2
	}
	return min(d, w.cfg.RetryMax)
}

// write patches the condition onto the Node's status, merged by type (a strategic
// merge patch, as node-problem-detector does): the kubelet's conditions stay as they are.
func (w *Writer) write(ctx context.Context, s *state, want Condition) error {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	if s.client == nil {
		c, err := w.connect()
		if err != nil {
			return fmt.Errorf("cluster API: %w", err)
		}
		s.client = c
		if w.newRecorder != nil {
			s.recorder, s.stop = w.newRecorder(c)
		} else {
			s.recorder, s.stop = apiRecorder(c, w.cfg.NodeName)
		}
	}
	if !s.read {
		// Once: the condition a previous imagepind wrote keeps its transition time.
		node, err := s.client.CoreV1().Nodes().Get(ctx, w.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get node %s: %w", w.cfg.NodeName, err)
		}
		s.ref = &corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}
		for _, c := range node.Status.Conditions {
			if string(c.Type) == Type {
				s.inAPI = &Condition{Status: string(c.Status), Reason: c.Reason, Message: c.Message}
				s.since = c.LastTransitionTime.Time
			}
		}
		s.read = true
		s.held = s.inAPI != nil && s.inAPI.Status == status.True
	}
	now := w.cfg.Clock.Now()
	if s.held {
		if (want.Reason == ReasonSetsNotReady || want.Reason == ReasonTagsNotHeld) && now.Before(s.started.Add(w.cfg.StartupGrace)) {
			return errHeld
		}
		s.held = false
	}
	since := s.since
	changed := s.inAPI == nil || s.inAPI.Status != want.Status
	if changed {
		since = now
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type: corev1.NodeConditionType(Type), Status: corev1.ConditionStatus(want.Status),
		Reason: want.Reason, Message: want.Message,
		LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(since),
	}}}})
	if err != nil {
		return err
	}
	if _, err := s.client.CoreV1().Nodes().PatchStatus(ctx, w.cfg.NodeName, patch); err != nil {
		return fmt.Errorf("patch node %s status: %w", w.cfg.NodeName, err)
	}
	w.writes.Add(1)
	prev := s.inAPI
	s.inAPI, s.since, s.at = &want, since, now
	if changed && prev != nil {
		s.flipped = now
	}
	if changed {
		log := w.cfg.Log.WithField("node", w.cfg.NodeName).WithField("reason", want.Reason)
		switch {
		case want.Status == status.True:
			s.recorder.Event(s.ref, corev1.EventTypeNormal, EventReady, want.Message)
			log.Info("node condition " + Type + " True")
		case prev != nil && prev.Status == status.True:
			// Pods placed here now may pull from registries: worth a warning.
			s.recorder.Event(s.ref, corev1.EventTypeWarning, EventNotReady, want.Message)
			log.Warn("node condition " + Type + " False: " + want.Message)
		default:
			s.recorder.Event(s.ref, corev1.EventTypeNormal, EventNotReady, want.Message)
			log.Info("node condition " + Type + " False: " + want.Message)
		}
	}
	return nil
}

// apiRecorder records events to the API as the kubelet does (core/v1, in the default
// namespace for a Node), through client-go's correlator: similar events are aggregated
// and each source is rate-limited, so a flapping condition cannot flood the API.
func apiRecorder(c kubernetes.Interface, node string) (record.EventRecorder, func()) {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.CoreV1().Events("")})
	return b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "imagepind", Host: node}), b.Shutdown
}
