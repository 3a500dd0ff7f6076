package crio

import (
	"context"
	"fmt"
)

// Reloader makes CRI-O re-read its config.
type Reloader interface {
	Reload(ctx context.Context) error
}

// FallbackReloader is reload = "auto": the primary (systemd over D-Bus) when it is
// available, else the fallback (SIGHUP to the socket's owner).
type FallbackReloader struct {
	Primary, Fallback Reloader
	// Unavailable says whether the primary's error means "not available here".
	Unavailable func(error) bool
	// OnFallback is told why the primary was skipped (for the log).
	OnFallback func(error)
}

// Reload tries the primary, then the fallback when the primary is unavailable.
func (f FallbackReloader) Reload(ctx context.Context) error {
	err := f.Primary.Reload(ctx)
	if err == nil || !f.Unavailable(err) {
		return err
	}
	if f.OnFallback != nil {
		f.OnFallback(err)
	}
	if ferr := f.Fallback.Reload(ctx); ferr != nil {
		return fmt.Errorf("%v; fallback: %w", err, ferr)
	}
	return nil
}
