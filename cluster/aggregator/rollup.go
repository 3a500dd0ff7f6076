package aggregator

import (
	"sort"
	"time"

	"github.com/imagepin/imagepin/api/readv1"

	"github.com/imagepin/imagepin/status"
)

// UnknownAfter is how many heartbeats a node may miss before it is Unknown.
const UnknownAfter = 3

// The read API's views (api/readv1): what the JSON API, the page and imagepinctl show.
type (
	SetView  = readv1.SetView
	SetNode  = readv1.SetNode
	NodeView = readv1.NodeView
)

// PhaseUnknown marks a node that went silent (or never reported).
const PhaseUnknown = readv1.PhaseUnknown

func (e *nodeEntry) unknown(now time.Time) bool {
	return now.Sub(e.received) > time.Duration(UnknownAfter)*e.heartbeat
}

// Sets rolls every node's newest report up per set, sorted by name, listing every node.
func (s *Store) Sets() []SetView { return s.rollup("", true) }

// SetsSummary is Sets listing only the nodes that are not Ready (the counts cover all):
// at thousands of nodes, the ones that need attention.
func (s *Store) SetsSummary() []SetView { return s.rollup("", false) }

// rollup builds the views of every set, or of the named one only; allNodes lists Ready
// nodes too.
func (s *Store) rollup(only string, allNodes bool) []SetView {
	holders := s.holdersIndex()
	now := s.now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	views := map[string]*SetView{}
	for _, e := range s.nodes {
		unknown := e.unknown(now)
		received := e.received
		for _, set := range e.status.Sets {
			if only != "" && set.Name != only {
				continue
			}
			if _, api := s.targets[set.Name]; api {
				continue // rolled up over its targeted nodes below
			}
			v := views[set.Name]
			if v == nil {
				v = &SetView{Name: set.Name}
				views[set.Name] = v
			}
			v.Targeted++
			v.ImagesTotal += set.ImagesTotal
			v.ImagesReady += set.ImagesReady
			v.BytesTotal += set.BytesTotal
			v.BytesReady += set.BytesReady
			v.BytesFromRegistry += set.BytesFromRegistry
			if !unknown {
				v.AddRegistry(e.name, set.Phase, set.Condition(status.ConditionRegistryIndependent), set.Condition(status.ConditionPodsStartWithoutRegistry))
			}
			if !unknown && set.Phase == status.Ready {
				v.ReadyNodes++
				if !allNodes {
					continue
				}
			}
			n := SetNode{Node: e.name, Phase: string(set.Phase), ImagesTotal: set.ImagesTotal, ImagesReady: set.ImagesReady,
				BytesTotal: set.BytesTotal, BytesReady: set.BytesReady, FailedImages: set.FailedImages, LastReport: &received}
			if c := set.Condition(status.ConditionReady); c != nil {
				n.Reason, n.Message = c.Reason, c.Message
			}
			switch {
			case unknown:
				n.Phase = PhaseUnknown
				n.Reason, n.Message = "NodeSilent", "no report for "+now.Sub(received).Round(time.Second).String()+" (heartbeat "+e.heartbeat.String()+")"
				v.UnknownNodes++
			case set.Phase == status.Ready:
			case set.Phase == status.Failed:
				v.FailedNodes++
			default:
				v.ProgressingNodes++
				n.ETASeconds = eta(e.progress[set.Name], set, now)
			}
			v.Nodes = append(v.Nodes, n)
		}
	}
	// Expected nodes that never reported: nobody knows which sets they need, so they
	// hold every set back.
	var silent []string
	for n := range s.expected {
		if _, ok := s.nodes[n]; !ok {
			silent = append(silent, n)
		}
	}
	sort.Strings(silent)
	out := make([]SetView, 0, len(views))
	for _, v := range views {
		for _, n := range silent {
			v.Targeted++
			v.UnknownNodes++
			v.Nodes = append(v.Nodes, SetNode{Node: n, Phase: PhaseUnknown, Reason: "NeverReported", Message: "an expected node has never reported"})
		}
		finish(v)
		v.BlobHolders = holders.setAnswer(v.Name)
		out = append(out, *v)
	}
	for name, t := range s.targets {
		if only == "" || only == name {
			v := s.targetView(name, t, allNodes, now)
			v.BlobHolders = holders.setAnswer(name)
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// finish sets Ready and the set's ETA (its slowest node's) and sorts the nodes.
func finish(v *SetView) {
	v.Ready = v.Targeted > 0 && v.ReadyNodes == v.Targeted
	v.FinishRegistry()
	for _, n := range v.Nodes {
		if n.ETASeconds != nil && (v.ETASeconds == nil || *n.ETASeconds > *v.ETASeconds) {
			eta := *n.ETASeconds
			v.ETASeconds = &eta
		}
	}
	sort.Slice(v.Nodes, func(i, j int) bool { return v.Nodes[i].Node < v.Nodes[j].Node })
}

// Set is one set's view, and whether any node reports it. It rolls up that set only;
// allNodes lists Ready nodes too.
func (s *Store) Set(name string, allNodes bool) (SetView, bool) {
	if name == "" {
		return SetView{}, false
	}
	views := s.rollup(name, allNodes)
	if len(views) == 0 {
		return SetView{}, false
	}
	return views[0], true
}

// eta extrapolates a node's progress on a set from the first sample of this set version:
// bytes when known, else images. nil when there is no progress to go by.
func eta(first progressSample, set status.Set, now time.Time) *float64 {
	elapsed := now.Sub(first.at).Seconds()
	if first.at.IsZero() || elapsed <= 0 {
		return nil
	}
	var done, remaining float64
	if set.BytesTotal > 0 {
		done, remaining = float64(set.BytesReady)-float64(first.bytes), float64(set.BytesTotal-set.BytesReady)
	} else {
		done, remaining = float64(set.ImagesReady-first.images), float64(set.ImagesTotal-set.ImagesReady)
	}
	if done <= 0 {
		return nil
	}
	v := remaining / (done / elapsed)
	return &v
}

// Nodes lists every known or expected node.
func (s *Store) Nodes() []NodeView {
	now := s.now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []NodeView
	for _, name := range s.nodeNames() {
		e := s.nodes[name]
		if e == nil {
			out = append(out, NodeView{Name: name, Unknown: true, NeverReported: true})
			continue
		}
		received := e.received
		v := NodeView{Name: name, Unknown: e.unknown(now), LastReport: &received, AgeSeconds: now.Sub(received).Seconds(),
			Heartbeat: e.heartbeat.String(), BootID: e.bootID, Sets: len(e.status.Sets), Faults: e.status.Faults, FileErrors: e.status.FileErrors}
		for _, set := range e.status.Sets {
			if set.Phase == status.Ready {
				v.SetsReady++
			}
		}
		out = append(out, v)
	}
	return out
}

// Node returns a node's newest report, as the node sent it.
func (s *Store) Node(name string) (status.Node, NodeView, bool) {
	for _, v := range s.Nodes() {
		if v.Name == name {
			s.mu.RLock()
			defer s.mu.RUnlock()
			if e := s.nodes[name]; e != nil {
				return e.status, v, true
			}
			return status.Node{}, v, true
		}
	}
	return status.Node{}, NodeView{}, false
}
