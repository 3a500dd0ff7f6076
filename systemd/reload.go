package systemd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/coreos/go-systemd/v22/dbus"
)

// ErrUnavailable means the system bus does not answer or systemd does not know the
// unit: a caller in "auto" mode falls back to the signal.
var ErrUnavailable = errors.New("systemd unavailable")

// UnitReloader reloads a unit like `systemctl reload`.
type UnitReloader struct {
	Unit string

	mu   sync.Mutex
	conn *dbus.Conn
}

// String names the method for logs and metrics.
func (r *UnitReloader) String() string { return "systemd" }

func (r *UnitReloader) connection(ctx context.Context) (*dbus.Conn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn != nil && r.conn.Connected() {
		return r.conn, nil
	}
	if r.conn != nil {
		r.conn.Close()
		r.conn = nil
	}
	conn, err := dbus.NewSystemConnectionContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: connect to the system bus: %v", ErrUnavailable, err)
	}
	r.conn = conn
	return conn, nil
}

func (r *UnitReloader) drop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn != nil {
		r.conn.Close()
		r.conn = nil
	}
}

// Reload queues a reload job for the unit and waits for its result. "done" only means
// systemd delivered the reload (for CRI-O, a SIGHUP): the caller confirms the effect.
func (r *UnitReloader) Reload(ctx context.Context) error {
	conn, err := r.connection(ctx)
	if err != nil {
		return err
	}
	load, err := conn.GetUnitPropertyContext(ctx, r.Unit, "LoadState")
	if err != nil {
		r.drop()
		return fmt.Errorf("%w: %s: %v", ErrUnavailable, r.Unit, err)
	}
	if v, _ := load.Value.Value().(string); v != "loaded" {
		return fmt.Errorf("%w: unit %s is %s", ErrUnavailable, r.Unit, v)
	}
	ch := make(chan string, 1)
	if _, err := conn.ReloadUnitContext(ctx, r.Unit, "replace", ch); err != nil {
		if strings.Contains(err.Error(), "not found") {
			return fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		r.drop()
		return fmt.Errorf("reload %s: %w", r.Unit, err)
	}
	select {
	case result := <-ch:
		if result != "done" {
			return fmt.Errorf("reload %s: job %s", r.Unit, result)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("reload %s: %w", r.Unit, ctx.Err())
	}
}
