package replica

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// serving is a report listener that is ready at once and serves until ctx ends.
func serving(ctx context.Context, ready func()) error {
	ready()
	<-ctx.Done()
	return ctx.Err()
}

// Without leader election the replica leads at once, and stops cleanly.
func TestLeadsWithoutElection(t *testing.T) {
	r := New(Config{Serve: serving})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	eventually(t, "leading", r.Leading)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r.Leading() {
		t.Fatal("still leading after the end")
	}
}

// A leader whose report port is taken must not keep the Lease: Run ends with the error
// while the election would go on, and the status writer is stopped.
func TestLeaderThatCannotServeGivesUp(t *testing.T) {
	writerStopped := make(chan struct{})
	r := New(Config{
		Elect: func(ctx context.Context, lead func(context.Context)) error {
			lead(ctx)
			<-ctx.Done() // a real election would hold the Lease until ctx ends
			return ctx.Err()
		},
		Serve: func(ctx context.Context, ready func()) error {
			return errors.New("listen tcp :9443: address already in use")
		},
		Write: func(ctx context.Context) error { <-ctx.Done(); close(writerStopped); return nil },
	})
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "leading: listen tcp :9443") {
			t.Fatalf("%v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a leader that cannot serve kept leading")
	}
	<-writerStopped
	if r.Leading() {
		t.Fatal("Leading after giving up")
	}
}

// Leadership lost: Run returns the election's error (the process exits and starts over
// as a standby), and the replica no longer takes reports.
func TestLostLeadershipEndsRun(t *testing.T) {
	lost := errors.New("leader election lost")
	r := New(Config{
		Elect: func(ctx context.Context, lead func(context.Context)) error {
			lctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			lead(lctx)
			return lost
		},
		Serve: serving,
	})
	if err := r.Run(context.Background()); !errors.Is(err, lost) {
		t.Fatalf("%v", err)
	}
	if r.Leading() {
		t.Fatal("Leading after losing the Lease")
	}
}

// A standby is not leading; it leads once elected.
func TestStandbyLeadsOnceElected(t *testing.T) {
	elected := make(chan struct{})
	r := New(Config{
		Elect: func(ctx context.Context, lead func(context.Context)) error {
			select {
			case <-elected:
			case <-ctx.Done():
				return nil
			}
			lead(ctx)
			return nil
		},
		Serve: serving,
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	time.Sleep(50 * time.Millisecond)
	if r.Leading() {
		t.Fatal("a standby takes reports")
	}
	close(elected)
	eventually(t, "leading once elected", r.Leading)
}
