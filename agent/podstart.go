package agent

import (
	"context"

	"github.com/imagepin/imagepin/kubelet"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/registrygone"
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
	ids     map[string]string // name → image ID (ListImages, as the runtime spells names)
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
			a.sched.set(podStartKey, nextLook(&a.lookAgain.kubelet, a.deps.Clock.Now(), a.cfg.VerifyEvery))
			if err != nil && a.kube.err == nil {
				a.log.WithError(err).Warn("kubelet's image pull credential verification: cannot tell")
			}
			a.kube.v, a.kube.err, a.kube.ids, a.kube.known = v, err, ids, true
		}
	})
}

// registryConditions are the RegistryIndependent condition of a set (whether pods start
// from its images on this node with the registry gone, and a node joining gets them
// from its peers) and its node-local part alone, PodsStartWithoutRegistry
// (registrygone.Decide, as imagepinctl check --registry-gone). f holds what setStatus
// found of the set's images and tags; the phase and the kubelet's files come from o and
// ps.
func registryConditions(o phaseOutcome, ps podStart, f registrygone.Facts) []status.Condition {
	// A runtime that does not answer is f.RuntimeErr, not the phase's words.
	if o.Phase != status.Ready && o.Reason != status.ReasonRuntimeUnavailable {
		f.NotReady = o.Message
	}
	f.KubeletRead, f.KubeletErr, f.Verification, f.IDs = ps.known, ps.err, ps.v, ps.ids
	v := registrygone.Decide(f)
	return []status.Condition{v.Condition(), v.NodeCondition()}
}

// tagsHeld says which of tags the runtime holds as their pinned digests (nil
// Deps.Tags: none).
func (a *Agent) tagsHeld(tags []pinset.Tag) map[string]bool {
	held := map[string]bool{}
	for _, t := range tags {
		held[t.Name] = a.deps.Tags != nil && a.deps.Tags.Held(t)
	}
	return held
}
