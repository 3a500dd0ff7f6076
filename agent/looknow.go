package agent

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
func (a *Agent) lookedNow() {
	now := a.deps.Clock.Now()
	a.in.dirty = true
	a.sched.set(verifyKey, now)
	a.sched.clear(podStartKey)
	a.log.Info("looking at the node again now (reload): files, the runtime's images and the kubelet's verification")
}
