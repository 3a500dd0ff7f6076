package systemd

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// No system bus (a container without systemd, D-Bus stopped): the error is
// ErrUnavailable, which makes reload = "auto" fall back to the signal. The real
// systemd and D-Bus paths run in the e2e tier (TestSystemdUnitNotifyWatchdogAndDBusReload, TestSystemdBusGoneAutoFallsBackToSignal).
func TestReloadWithoutABusIsUnavailable(t *testing.T) {
	t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path="+filepath.Join(t.TempDir(), "no-bus"))
	r := &UnitReloader{Unit: "crio.service"}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := r.Reload(ctx)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Reload without a bus: %v, want ErrUnavailable", err)
	}
	// Asked again, it dials again rather than keeping a broken connection.
	if err := r.Reload(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("second Reload: %v", err)
	}
	if r.String() != "systemd" {
		t.Fatalf("String() = %q", r.String())
	}
}
