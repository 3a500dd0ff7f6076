package clustersync

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

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
