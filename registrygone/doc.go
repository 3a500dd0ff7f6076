// Package registrygone answers one question for one set on one node: can pods start
// from the set's images with the registry gone? Decide takes the facts (which images are
// missing or present but not pinned, whether the runtime answers, which of the set's
// pinned tags the runtime holds as their pinned digests, what the kubelet's image pull
// credential verification does with the images, and the aggregator's count of the
// nodes holding each blob of the images for a node that joins or replaces one) and
// returns the verdict: True, False or Unknown, with a reason, a message and the list of
// what stands in the way.
//
// The verdict also carries its node-local part alone (Verdict.Node): whether this
// node's own pods start, whatever the count of holders says, so that a node whose own
// pods start is never counted as one that would pull, and a count of holders that falls
// short never hides a kubelet whose answer is not sure.
//
// imagepind turns the verdict into the set's RegistryIndependent condition
// (Verdict.Condition) and its node-local part into PodsStartWithoutRegistry
// (Verdict.NodeCondition); imagepinctl check --registry-gone prints both and exits 0
// only when the whole is True. Both say the same words because both call Decide. The package
// gathers nothing itself: each caller reads the runtime and the kubelet its own way.
package registrygone
