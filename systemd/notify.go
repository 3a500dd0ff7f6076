package systemd

import (
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Notifier speaks sd_notify; without NOTIFY_SOCKET every call is a no-op.
type Notifier struct{}

// Ready tells systemd that start-up is done (Type=notify).
func (Notifier) Ready() { _, _ = daemon.SdNotify(false, daemon.SdNotifyReady) }

// Status sets the unit's STATUS= line.
func (Notifier) Status(s string) { _, _ = daemon.SdNotify(false, "STATUS="+s) }

// Stopping tells systemd the service is shutting down.
func (Notifier) Stopping() { _, _ = daemon.SdNotify(false, daemon.SdNotifyStopping) }

// Watchdog pings systemd's watchdog.
func (Notifier) Watchdog() { _, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog) }

// WatchdogInterval is how often to ping (half of WatchdogSec), 0 when not enabled.
func (Notifier) WatchdogInterval() time.Duration {
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil || d <= 0 {
		return 0
	}
	return d / 2
}
