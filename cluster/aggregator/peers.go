package aggregator

import (
	"crypto/sha256"
	"slices"
	"sort"
)

// MaxPeers bounds the peers handed to a node for one set: a node shares with at most
// this many others (the same ones for every node of the set: those of lowest hash), so
// an ack stays small in a large cluster.
const MaxPeers = 64

// peerIndex is, for each set, the nodes that pin it and serve peers (their address),
// and the list handed out for it (sorted by address, at most MaxPeers; computed when
// asked).
type peerIndex struct {
	bySet map[string]map[string]string // set → node → address
	lists map[string][]peerRef         // set → handed-out list
}

// peerRef is one node of a handed-out list.
type peerRef struct{ node, address string }

// update records node's address and sets (old are its sets before): called with the
// store's lock held, at each accepted report.
func (p *peerIndex) update(node, address string, old, sets []string) {
	if p.bySet == nil {
		p.bySet, p.lists = map[string]map[string]string{}, map[string][]peerRef{}
	}
	for _, s := range old {
		if m := p.bySet[s]; m != nil && (address == "" || !slices.Contains(sets, s) || m[node] != address) {
			if _, ok := m[node]; ok {
				delete(m, node)
				delete(p.lists, s)
			}
		}
	}
	if address == "" {
		return
	}
	for _, s := range sets {
		m := p.bySet[s]
		if m == nil {
			m = map[string]string{}
			p.bySet[s] = m
		}
		if m[node] != address {
			m[node] = address
			delete(p.lists, s)
		}
	}
}

// forget removes node from every set.
func (p *peerIndex) forget(node string, sets []string) {
	p.update(node, "", sets, nil)
}

// list is the nodes handed out for set.
func (p *peerIndex) list(set string) []peerRef {
	if l, ok := p.lists[set]; ok {
		return l
	}
	var refs []peerRef
	for n, a := range p.bySet[set] {
		refs = append(refs, peerRef{n, a})
	}
	if len(refs) > MaxPeers {
		h := func(a string) [32]byte { return sha256.Sum256([]byte(set + "\x00" + a)) }
		sort.Slice(refs, func(i, j int) bool {
			hi, hj := h(refs[i].address), h(refs[j].address)
			return string(hi[:]) < string(hj[:])
		})
		refs = refs[:MaxPeers]
	}
	sort.Slice(refs, func(i, j int) bool { return refs[i].address < refs[j].address })
	p.lists[set] = refs
	return refs
}

// Peers are the peer addresses of the nodes that pin a set node pins (node's own among
// them), for the node's report ack; nil when node serves no peers. A node whose reports
// stopped (Unknown: UnknownAfter heartbeats missed, a node taken out or down) is not
// handed out: a joining node would lay its blobs' trees through it and wait for it.
func (s *Store) Peers(node string) []string {
	s.mu.Lock() // list caches
	defer s.mu.Unlock()
	e := s.nodes[node]
	if e == nil || e.status.Node.Peers == nil || e.status.Node.Peers.Address == "" {
		return nil
	}
	now := s.now()
	seen := map[string]bool{}
	var out []string
	for _, set := range e.status.Sets {
		for _, p := range s.peers.list(set.Name) {
			if seen[p.address] {
				continue
			}
			if pe := s.nodes[p.node]; pe == nil || (pe != e && pe.unknown(now)) {
				continue
			}
			seen[p.address] = true
			out = append(out, p.address)
		}
	}
	sort.Strings(out)
	return out
}

func setNames(n *nodeEntry) []string {
	var names []string
	for _, s := range n.status.Sets {
		names = append(names, s.Name)
	}
	return names
}

func peerAddress(n *nodeEntry) string {
	if p := n.status.Node.Peers; p != nil {
		return p.Address
	}
	return ""
}
