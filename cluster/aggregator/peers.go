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
// and the list handed out for it (sorted, at most MaxPeers; computed when asked).
type peerIndex struct {
	bySet map[string]map[string]string // set → node → address
	lists map[string][]string          // set → handed-out list
}

// update records node's address and sets (old are its sets before): called with the
// store's lock held, at each accepted report.
func (p *peerIndex) update(node, address string, old, sets []string) {
	if p.bySet == nil {
		p.bySet, p.lists = map[string]map[string]string{}, map[string][]string{}
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

// list is the addresses handed out for set.
func (p *peerIndex) list(set string) []string {
	if l, ok := p.lists[set]; ok {
		return l
	}
	var addrs []string
	for _, a := range p.bySet[set] {
		addrs = append(addrs, a)
	}
	if len(addrs) > MaxPeers {
		h := func(a string) [32]byte { return sha256.Sum256([]byte(set + "\x00" + a)) }
		sort.Slice(addrs, func(i, j int) bool {
			hi, hj := h(addrs[i]), h(addrs[j])
			return string(hi[:]) < string(hj[:])
		})
		addrs = addrs[:MaxPeers]
	}
	sort.Strings(addrs)
	p.lists[set] = addrs
	return addrs
}

// Peers are the peer addresses of the nodes that pin a set node pins (node's own among
// them), for the node's report ack; nil when node serves no peers.
func (s *Store) Peers(node string) []string {
	s.mu.Lock() // list caches
	defer s.mu.Unlock()
	e := s.nodes[node]
	if e == nil || e.status.Node.Peers == nil || e.status.Node.Peers.Address == "" {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	for _, set := range e.status.Sets {
		for _, a := range s.peers.list(set.Name) {
			if !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
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
