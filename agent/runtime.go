package agent

import (
	"context"
	"errors"
	"time"

	"golang.org/x/sys/unix"

	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/pin"
)

// rpcTimeout bounds each CRI call: a hung runtime must not stall the loop (and so the
// watchdog) for long.
const rpcTimeout = 10 * time.Second

// pinWriteTimeout bounds one write of the pins (a drop-in, or containerd's labels, one
// call each), well inside systemd's watchdog (2 min).
const pinWriteTimeout = 30 * time.Second

// ensureRuntime asks the runtime for its version when it is not known (at start, and
// after the runtime went away: it may come back upgraded).
func (a *Agent) ensureRuntime(ctx context.Context) {
	if id := socketID(a.cfg.RuntimeSocket); id != a.rt.socketID {
		if a.rt.socketID != (fileID{}) {
			a.log.Info("container runtime socket re-created: the runtime restarted; checking every image again")
		}
		a.rt.socketID = id
		a.rt.runtime = cri.Version{}
		a.rt.retry.reset()
	}
	if a.rt.runtime.Version != "" && a.rt.err == nil {
		return
	}
	now := a.deps.Clock.Now()
	if !a.rt.retry.due(now) {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	v, err := a.deps.Runtime.Version(cctx)
	if err != nil {
		a.runtimeDown(err)
		return
	}
	pinner, perr := a.choosePinner(v.Name)
	if perr != nil && (a.rt.pinnerErr == nil || a.rt.pinnerErr.Error() != perr.Error()) {
		a.log.WithError(perr).Error("container runtime")
	}
	a.rt.pinnerErr = perr
	var support pin.Support
	if pinner != nil && perr == nil {
		var serr error
		if support, serr = pinner.Support(v.Version); serr != nil {
			a.log.WithError(serr).Warn("unknown runtime version; assuming pins apply without a restart")
		}
		if pinner != a.rt.pinner {
			a.rt.pinner, a.pins.confirmedValid = pinner, false
		}
	} else {
		support = pin.Support{PinnedField: false, WithoutRestart: false, Problem: perr.Error()}
	}
	if a.rt.err != nil || a.rt.runtime != v {
		a.log.WithField("runtime", v.Name+" "+v.Version).Info("container runtime available")
	}
	a.rt.runtime, a.rt.support, a.rt.err = v, support, nil
	a.rt.retry.reset()
	// The runtime may have restarted and lost images (a storage wipe): check them all again.
	for _, img := range a.pulls.images {
		img.checked = false
	}
}

// runtimeDown records that the runtime did not answer.
func (a *Agent) runtimeDown(err error) {
	if a.rt.err == nil {
		a.log.WithError(err).Warn("container runtime unavailable; retrying")
	}
	a.rt.err = err
	a.rt.runtime = cri.Version{}
	a.rt.retry.fail(a.deps.Clock.Now(), a.cfg.MaxBackoff, a.rand)
}

func (r *runtimeConn) up() bool { return r.err == nil && r.runtime.Version != "" }

// socketID identifies the socket file (inode and change time: inodes are reused), zero
// when absent or not configured.
func socketID(path string) fileID {
	var st unix.Stat_t
	if path == "" || unix.Stat(path, &st) != nil {
		return fileID{}
	}
	return fileID{ino: st.Ino, ctime: st.Ctim.Nano()}
}

type fileID struct {
	ino   uint64
	ctime int64
}

// isUnavailable says whether a CRI error means the runtime is down or hung.
func isUnavailable(err error) bool {
	return errors.Is(err, cri.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// label names the runtime for status messages.
func (r *runtimeConn) label() string {
	switch r.runtime.Name {
	case "cri-o":
		return "CRI-O"
	case "":
		return "the container runtime"
	}
	return r.runtime.Name
}
