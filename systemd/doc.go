// Package systemd reloads a unit over systemd's D-Bus API (waiting for the job's
// result, reconnecting when the bus went away) and speaks sd_notify (READY, STATUS,
// WATCHDOG).
package systemd
