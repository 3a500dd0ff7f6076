package crio

import (
	"context"
	"errors"
	"testing"
	"time"
)

type clockedCRIO struct {
	reloaded, read time.Time
}

func (c *clockedCRIO) Reload(context.Context) error { c.reloaded = time.Now(); return nil }
func (c *clockedCRIO) PinnedImages(context.Context) ([]string, error) {
	c.read = time.Now()
	return nil, nil
}

// CRI-O's config is not read while the reload may still run: reading GET /config
// during CRI-O 1.34's reload can kill CRI-O (ReloadSettle).
func TestApplyLetsTheReloadSettleBeforeTheConfigIsRead(t *testing.T) {
	c := &clockedCRIO{}
	p := &Pinner{DropIn: DropIn{MainConfig: t.TempDir() + "/crio.conf", ConfigDir: t.TempDir()}, Live: c, Reloader: c, Settle: 60 * time.Millisecond}
	if err := p.Apply(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := p.InEffect(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if gap := c.read.Sub(c.reloaded); gap < p.Settle {
		t.Fatalf("CRI-O's config read %s after the reload, within the %s it is left alone", gap, p.Settle)
	}

	// A daemon that stops does not wait the settle out.
	p.Settle = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := p.Apply(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Apply with a cancelled context: %v", err)
	}
}
