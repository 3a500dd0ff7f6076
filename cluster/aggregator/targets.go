package aggregator

import (
	"strings"
	"time"

	"github.com/imagepin/imagepin/status"
)

// Target is what the cluster's API says of a set: the nodes its selector matches now
// and the spec a node must report to count. Set by the cluster loop (SetTargets).
type Target struct {
	// SpecHash is the set's current spec as the node parser hashes it; a node reporting
	// another hash has not caught up yet.
	SpecHash string
	// File is where nodes keep the set (cluster/<name>.json), to find its file errors.
	File  string
	Nodes []string
}

// Reasons for a targeted node that has no current report of a set.
const (
	ReasonNeverReported = "NeverReported"
	ReasonNodeSilent    = "NodeSilent"
	ReasonNotReceived   = "NotReceived"
	ReasonSpecNotSynced = "SpecNotSynced"
	ReasonFileError     = "FileError"
)

// SetTargets replaces every set's targets. From then on a set with targets is rolled up
// over exactly its targeted nodes, whether or not they reported it (a node that did not
// is Unknown); sets without targets (local files only) still roll up from reports.
func (s *Store) SetTargets(t map[string]Target) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.targets = t
}

// targetView rolls up one set over its targeted nodes. Called with s.mu held for reading.
func (s *Store) targetView(name string, t Target, allNodes bool, now time.Time) SetView {
	v := SetView{Name: name}
	for _, node := range t.Nodes {
		v.Targeted++
		e := s.nodes[node]
		if e == nil {
			v.UnknownNodes++
			v.Nodes = append(v.Nodes, SetNode{Node: node, Phase: PhaseUnknown, Reason: ReasonNeverReported,
				Message: "the set targets this node, which has never reported (is imagepind running there, with [report] aggregator set?)"})
			continue
		}
		received := e.received
		if e.unknown(now) {
			v.UnknownNodes++
			v.Nodes = append(v.Nodes, SetNode{Node: node, Phase: PhaseUnknown, Reason: ReasonNodeSilent, LastReport: &received,
				Message: "no report for " + now.Sub(received).Round(time.Second).String() + " (heartbeat " + e.heartbeat.String() + ")"})
			continue
		}
		set := e.status.Set(name)
		if set == nil {
			n := SetNode{Node: node, Phase: PhaseUnknown, Reason: ReasonNotReceived, LastReport: &received,
				Message: "the node reports but not this set yet (its cluster sync is behind, or its labels are)"}
			if msg, ok := fileError(e.status, name, t.File); ok {
				n.Reason, n.Message = ReasonFileError, msg
			}
			v.UnknownNodes++
			v.Nodes = append(v.Nodes, n)
			continue
		}
		v.ImagesTotal += set.ImagesTotal
		v.ImagesReady += set.ImagesReady
		v.BytesTotal += set.BytesTotal
		v.BytesReady += set.BytesReady
		v.BytesFromRegistry += set.BytesFromRegistry
		n := SetNode{Node: node, Phase: string(set.Phase), ImagesTotal: set.ImagesTotal, ImagesReady: set.ImagesReady,
			BytesTotal: set.BytesTotal, BytesReady: set.BytesReady, FailedImages: set.FailedImages, LastReport: &received}
		if c := set.Condition(status.ConditionReady); c != nil {
			n.Reason, n.Message = c.Reason, c.Message
		}
		if t.SpecHash == "" || set.SpecHash == t.SpecHash {
			v.AddRegistry(node, set.Phase, set.Condition(status.ConditionRegistryIndependent), set.Condition(status.ConditionPodsStartWithoutRegistry))
		}
		fileErr, hasFileErr := "", false
		if t.SpecHash != "" && set.SpecHash != t.SpecHash {
			fileErr, hasFileErr = fileError(e.status, name, t.File)
		}
		switch {
		case hasFileErr:
			// The node reports a set of this name from another file (a local file wins a
			// name clash) and cannot use the API's: that does not go away by waiting.
			v.UnknownNodes++
			n.Phase, n.Reason, n.Message = PhaseUnknown, ReasonFileError, fileErr
		case t.SpecHash != "" && set.SpecHash != t.SpecHash:
			// Ready on an older spec is not ready on this one.
			v.ProgressingNodes++
			n.Phase, n.Reason, n.Message = string(status.Pending), ReasonSpecNotSynced, "the node still reports an older spec of the set"
		case set.Phase == status.Ready:
			v.ReadyNodes++
			if !allNodes {
				continue
			}
		case set.Phase == status.Failed:
			v.FailedNodes++
		default:
			v.ProgressingNodes++
			n.ETASeconds = eta(e.progress[name], *set, now)
		}
		v.Nodes = append(v.Nodes, n)
	}
	finish(&v)
	return v
}

// fileError is the node's error for the set's file (cluster/<name>.json), or for a file
// defining a set of this name, if it reports one.
func fileError(n status.Node, name, file string) (string, bool) {
	for _, fe := range n.FileErrors {
		if fe.File == file || strings.Contains(fe.Error, `set "`+name+`"`) {
			return fe.Error, true
		}
	}
	return "", false
}

// Reported says whether a node has reported live to this process: a report restored
// from the state file does not count (its node may have been gone for hours).
func (s *Store) Reported(node string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.nodes[node]
	return ok && !e.restored
}
