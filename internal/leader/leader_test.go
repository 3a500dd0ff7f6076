package leader

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func cfg(id string) Config {
	return Config{Namespace: "imagepin", Name: "imagepin-aggregator", Identity: id,
		LeaseDuration: 1 * time.Second, RenewDeadline: 600 * time.Millisecond, Retry: 100 * time.Millisecond,
		Log: logrus.New()}
}

// Two replicas on one Lease: one leads; when it stops (ReleaseOnCancel), the standby
// takes over at once instead of waiting for the Lease to expire.
func TestOneLeadsAndTheStandbyTakesOverOnRelease(t *testing.T) {
	client := fake.NewClientset()
	leading := make(chan string, 2)
	lead := func(id string) func(context.Context) {
		return func(ctx context.Context) {
			leading <- id
			<-ctx.Done()
		}
	}
	ctxA, stopA := context.WithCancel(context.Background())
	doneA := make(chan error, 1)
	go func() { doneA <- RunWith(ctxA, client, cfg("a"), lead("a")) }()
	if id := <-leading; id != "a" {
		t.Fatalf("%s leads, want a", id)
	}
	ctxB, stopB := context.WithCancel(context.Background())
	defer stopB()
	doneB := make(chan error, 1)
	go func() { doneB <- RunWith(ctxB, client, cfg("b"), lead("b")) }()
	select {
	case id := <-leading:
		t.Fatalf("%s leads while a holds the Lease", id)
	case <-time.After(700 * time.Millisecond):
	}
	stopA()
	if err := <-doneA; err != nil {
		t.Fatalf("a stopped by its context: %v, want nil", err)
	}
	select {
	case id := <-leading:
		if id != "b" {
			t.Fatalf("%s leads, want b", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b did not take over after a released the Lease")
	}
	lease, err := client.CoordinationV1().Leases("imagepin").Get(context.Background(), "imagepin-aggregator", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "b" {
		t.Fatalf("lease holder: %v, %v", lease, err)
	}
	stopB()
	<-doneB
}

// A leader that can no longer renew (the API refuses its updates) stops leading and
// Run returns ErrLost, so the process exits and comes back as a standby.
func TestLeaderThatCannotRenewReturnsErrLost(t *testing.T) {
	client := fake.NewClientset()
	// Reactors are set before the client is used (the fake does not lock them); the
	// switch turns the failure on.
	var refuse atomic.Bool
	client.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refuse.Load() {
			return true, nil, errors.New("etcdserver: request timed out")
		}
		return false, nil, nil
	})
	started := make(chan struct{})
	ended := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- RunWith(context.Background(), client, cfg("a"), func(ctx context.Context) {
			close(started)
			<-ctx.Done()
			close(ended)
		})
	}()
	<-started
	refuse.Store(true)
	select {
	case err := <-done:
		if !errors.Is(err, ErrLost) {
			t.Fatalf("Run: %v, want ErrLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still leading 10 s after renewals began to fail")
	}
	// client-go runs lead in its own goroutine and ends its context as Run returns.
	select {
	case <-ended:
	case <-time.After(2 * time.Second):
		t.Fatal("lead's context was not ended when leadership was lost")
	}
}
