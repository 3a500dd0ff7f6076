package starttaint

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
)

// DefaultKey is the startup taint's key; nodes register with it as NoSchedule.
const DefaultKey = "imagepin.io/images-not-ready"

// EventRemoved is the reason of the Event on a Node whose taint was removed.
const EventRemoved = "StartupTaintRemoved"

// Config names the taint and the condition that lifts it.
type Config struct {
	// Key is the taint's key: every taint with it (whatever its effect) is removed.
	Key string
	// Condition is the Node condition type that must be True (nodecondition.Type).
	Condition string
	Log       logrus.FieldLogger
}

// Remover lifts the startup taint off nodes whose condition is True, while Lead runs.
type Remover struct {
	cfg      Config
	client   kubernetes.Interface
	recorder record.EventRecorder
	removed  atomic.Int64
}

// New returns a remover over the client; Lead runs it. recorder takes an Event on the
// Node for each removal (nil: none).
func New(client kubernetes.Interface, recorder record.EventRecorder, cfg Config) *Remover {
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	return &Remover{cfg: cfg, client: client, recorder: recorder}
}

// Removed counts the taints removed so far.
func (r *Remover) Removed() int64 { return r.removed.Load() }

// Lead watches the Nodes and removes the taint where it is due, until ctx (the
// leadership) ends; it returns nil then. Each term starts its own informer: a standby
// keeps no Node cache for this.
func (r *Remover) Lead(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(r.client, 0, informers.WithTransform(r.trim))
	inf := factory.Core().V1().Nodes().Informer()
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](500*time.Millisecond, time.Minute),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "startup-taint"})
	defer queue.ShutDown()
	enqueue := func(obj any) {
		if n, ok := obj.(*corev1.Node); ok && r.due(n) {
			queue.Add(n.Name)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil
	}
	go func() { <-ctx.Done(); queue.ShutDown() }()
	// The resourceVersion each node's taint was removed at: until the informer has the
	// newer object, its stale copy is not due again.
	removedAt := map[string]string{}
	for {
		name, quit := queue.Get()
		if quit {
			return nil
		}
		obj, exists, _ := inf.GetStore().GetByKey(name)
		n, _ := obj.(*corev1.Node)
		if at, ok := removedAt[name]; !exists || n == nil || !r.due(n) || (ok && at == n.ResourceVersion) {
			queue.Forget(name)
			queue.Done(name)
			continue
		}
		if err := r.remove(ctx, n); err != nil {
			if ctx.Err() == nil {
				r.cfg.Log.WithError(err).WithField("node", name).Warn("startup taint not removed; retrying")
				queue.AddRateLimited(name)
			}
		} else {
			removedAt[name] = n.ResourceVersion
			queue.Forget(name)
		}
		queue.Done(name)
	}
}

// trim keeps of a Node what the remover reads: its name, taints and the one condition.
// At thousands of nodes the cache holds a few hundred bytes each, not whole objects.
func (r *Remover) trim(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	t := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion},
		Spec: corev1.NodeSpec{Taints: n.Spec.Taints}}
	for _, c := range n.Status.Conditions {
		if string(c.Type) == r.cfg.Condition {
			t.Status.Conditions = []corev1.NodeCondition{c}
		}
	}
	return t, nil
}

// due: the node carries the taint and its condition is True.
func (r *Remover) due(n *corev1.Node) bool {
	return r.tainted(n) >= 0 && r.condition(n) != nil && r.condition(n).Status == corev1.ConditionTrue
}

func (r *Remover) tainted(n *corev1.Node) int {
	for i, t := range n.Spec.Taints {
		if t.Key == r.cfg.Key {
			return i
		}
	}
	return -1
}

func (r *Remover) condition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if string(n.Status.Conditions[i].Type) == r.cfg.Condition {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// remove takes the taint off with a JSON patch that first tests that the taint is still
// at that index: a taint added or removed meanwhile fails the test, never gets dropped,
// and the node is tried again from the informer's newer copy.
func (r *Remover) remove(ctx context.Context, n *corev1.Node) error {
	i := r.tainted(n)
	taint, err := json.Marshal(n.Spec.Taints[i])
	if err != nil {
		return err
	}
	path := fmt.Sprintf("/spec/taints/%d", i)
	patch, err := json.Marshal([]map[string]any{
		{"op": "test", "path": path, "value": json.RawMessage(taint)},
		{"op": "remove", "path": path},
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := r.client.CoreV1().Nodes().Patch(ctx, n.Name, types.JSONPatchType, patch, metav1.PatchOptions{FieldManager: "imagepin-aggregator"}); err != nil {
		return fmt.Errorf("remove taint %s from node %s: %w", r.cfg.Key, n.Name, err)
	}
	r.removed.Add(1)
	c := r.condition(n)
	r.cfg.Log.WithField("node", n.Name).WithField("taint", r.cfg.Key).Info("startup taint removed: the node's pinned images are in")
	if r.recorder != nil {
		ref := &corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}
		r.recorder.Eventf(ref, corev1.EventTypeNormal, EventRemoved, "taint %s removed: %s is True (%s)", r.cfg.Key, r.cfg.Condition, c.Message)
	}
	return nil
}
