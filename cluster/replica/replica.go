// Package replica runs the leading half of one imagepin-aggregator replica: while it
// leads (holds the Lease; or always, without leader election) it takes nodes' reports and
// writes set status. A leader that cannot do either (its report port taken, its status
// writer failing for good) ends Run with the error, so the process exits and the Lease
// goes to the standby, rather than holding the Lease while serving nothing. Leading says
// whether reports are taken now: the readiness probe, so the Service sends nodes to one
// replica.
package replica

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"golang.org/x/sync/errgroup"
)

// Config is what a replica does while it leads, and how it is elected.
type Config struct {
	// Elect runs lead while this replica leads, until ctx ends or leadership is lost
	// (internal/leader.Run); nil: lead at once, for as long as ctx lasts.
	Elect func(ctx context.Context, lead func(ctx context.Context)) error
	// Serve takes reports until ctx ends; it calls ready once it listens.
	Serve func(ctx context.Context, ready func()) error
	// Write writes set status until ctx ends (clusterstatus.Loop.Lead); nil: none.
	Write func(ctx context.Context) error
}

// Replica is one replica's leading half; New builds it, Run runs it.
type Replica struct {
	cfg     Config
	leading atomic.Bool
}

// New returns a replica.
func New(cfg Config) *Replica { return &Replica{cfg: cfg} }

// Leading says whether the replica takes reports now.
func (r *Replica) Leading() bool { return r.leading.Load() }

// Run leads whenever elected until ctx ends (nil), leadership is lost (Elect's error), or
// leading fails (that error).
func (r *Replica) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	failed := make(chan error, 1)
	lead := func(ctx context.Context) {
		g, gctx := errgroup.WithContext(ctx)
		g.Go(func() error {
			defer r.leading.Store(false)
			return r.cfg.Serve(gctx, func() { r.leading.Store(true) })
		})
		if r.cfg.Write != nil {
			g.Go(func() error { return r.cfg.Write(gctx) })
		}
		// Leadership ending (ctx done: the Lease lost or given back) is no failure;
		// an error while it lasts is.
		if err := g.Wait(); err != nil && ctx.Err() == nil {
			select {
			case failed <- fmt.Errorf("leading: %w", err):
			default:
			}
			cancel() // give up the Lease: the standby takes over
		}
	}
	elect := r.cfg.Elect
	if elect == nil {
		elect = func(ctx context.Context, lead func(context.Context)) error { lead(ctx); return nil }
	}
	err := elect(ctx, lead)
	select {
	case f := <-failed:
		return f
	default:
	}
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
