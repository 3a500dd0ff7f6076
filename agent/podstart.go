package agent

import (
	"context"

	"github.com/imagepin/imagepin/kubelet"
	"github.com/imagepin/imagepin/status"
)

// podStartKey is the schedule's entry for the next look at the kubelet.
const podStartKey = "podstart"

// podStart is what the kubelet will do with the node's images at pod start: its image
// pull credential verification (config, drop-ins, its own pull records) and the image
// IDs its records are keyed by, read off the loop at start and every VerifyEvery.
type podStart struct {
	v       kubelet.Verification
	err     error
	ids     map[string]string // lower-cased name → image ID (ListImages)
	known   bool
	running bool
}

// checkPodStart reads the kubelet's files and lists the runtime's image IDs, off the
// loop: at the first pass with the runtime up, then every VerifyEvery.
func (a *Agent) checkPodStart() {
	if a.deps.Kubelet == nil || a.kube.running || !a.rt.up() {
		return
	}
	if at, ok := a.sched.when(podStartKey); ok && a.deps.Clock.Now().Before(at) {
		return
	}
	a.kube.running = true
	a.sched.clear(podStartKey)
	a.background(rpcTimeout, func(ctx context.Context) func() {
		v, err := a.deps.Kubelet()
		var ids map[string]string
		if err == nil {
			ids, err = a.deps.Runtime.ImageNames(ctx)
		}
		return func() {
			a.kube.running = false
			a.sched.set(podStartKey, a.deps.Clock.Now().Add(a.cfg.VerifyEvery))
			if err != nil && a.kube.err == nil {
				a.log.WithError(err).Warn("kubelet's image pull credential verification: cannot tell")
			}
			a.kube.v, a.kube.err, a.kube.ids, a.kube.known = v, err, ids, true
		}
	})
}

// registryCondition is the RegistryIndependent condition of a set: whether pods start
// from its images on this node with the registry gone.
func registryCondition(o phaseOutcome, ps podStart, refs []string) status.Condition {
	c := status.Condition{Type: status.ConditionRegistryIndependent, Status: status.Unknown}
	switch {
	case o.Phase != status.Ready:
		c.Status, c.Reason = status.False, status.ReasonNotReady
		c.Message = "not every image is present and pinned: " + o.Message
	case !ps.known:
		c.Reason, c.Message = status.ReasonCheckingKubelet, "reading the kubelet's image pull credential verification"
	case ps.err != nil:
		c.Reason = status.ReasonKubeletConfigUnreadable
		c.Message = "cannot tell whether the kubelet verifies pull credentials at pod start: " + ps.err.Error()
	default:
		d := ps.v.Decide(refs, ps.ids)
		c.Message = d.Message
		switch d.Answer {
		case kubelet.Starts:
			c.Status, c.Reason = status.True, status.ReasonPodsStartWithoutRegistry
		case kubelet.NeedsRegistry:
			c.Status, c.Reason = status.False, status.ReasonCredentialVerification
		default:
			// What the kubelet's credential verification does cannot be told.
			c.Reason = status.ReasonCredentialVerification
		}
	}
	return c
}
