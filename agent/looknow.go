package agent

import "time"

// LookNow asks the loop to look at the node again at once, instead of at the next
// presence check (every VerifyEvery, 2 minutes): every file is read again, the runtime's
// images are listed (an image removed behind imagepind's back is pulled again), and the
// kubelet's credential verification is read again. It is what `systemctl reload
// imagepind` (SIGHUP) does: after an administrator removed images by hand, say. Safe to
// call from any goroutine, any number of times: calls while one waits are one.
func (a *Agent) LookNow() {
	select {
	case a.lookNow <- struct{}{}:
	default:
	}
}

// lookedNow runs on the loop when LookNow was called: what the next pass checks at once.
// A look already under way (a ListImages, the kubelet's files) may have read the node
// before the reload: it is looked at again as soon as it ends.
func (a *Agent) lookedNow() {
	now := a.deps.Clock.Now()
	a.in.dirty = true
	a.sched.set(verifyKey, now)
	a.sched.clear(podStartKey)
	a.lookAgain.verify, a.lookAgain.kubelet = a.pulls.verifying, a.kube.running
	a.log.Info("looking at the node again now (reload): files, the runtime's images and the kubelet's verification")
}

// lookAgain: looks that were under way when LookNow came, to run again when they end.
type lookAgain struct{ verify, kubelet bool }

// nextLook is when a look that just ended runs again: at once if a reload came while it
// ran (again is then cleared), else after every.
func nextLook(again *bool, now time.Time, every time.Duration) time.Time {
	if *again {
		*again = false
		return now
	}
	return now.Add(every)
}
