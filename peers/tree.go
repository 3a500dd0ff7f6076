package peers

import (
	"context"
	"slices"
	"time"

	"github.com/opencontainers/go-digest"
)

// DefaultFanout is a Source's Fanout when none is set. Two: a blob streams down its
// tree (each node serves its children while it arrives), so one blob reaches every
// node in about the time of one copy at a node's upload rate divided by the fanout,
// plus the tree's depth (log2 of the nodes) times a hop's latency; across the many
// blobs of a set each node uploads about one copy of the set whatever the fanout.
const DefaultFanout = 2

func (s *Source) fanout() int {
	if s.Fanout < 1 {
		return DefaultFanout
	}
	return s.Fanout
}

// tree is key's rendezvous order of the nodes this node knows (itself among them) and
// this node's position in it (the last when it serves no peers).
func (s *Source) tree(key digest.Digest) (order []string, pos int) {
	var nodes []string
	for _, n := range s.Nodes() {
		if n != s.Self && !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	if s.Self != "" {
		nodes = append(nodes, s.Self)
	}
	order = Order(key, nodes)
	pos = len(order)
	if s.Self != "" {
		pos = slices.Index(order, s.Self)
	}
	return order, pos
}

// up are the ancestors of position p in a tree over order with k children a node, nearest
// first: the node at position p (0: the head) has its parent at (p-1)/k.
func up(order []string, p, k int) []string {
	var out []string
	for p > 0 {
		p = (p - 1) / k
		out = append(out, order[p])
	}
	return out
}

// ancestors are whom this node asks for a blob before the registry: its ancestors in
// key's tree laid over every node it knows (up), those it set aside left out; then,
// when the head is set aside, the first node of the order it did not set aside (the
// head's place passes down the order: a dead head's first child heads). Every one of
// them weighs more than this node in key's order, whatever the peers each node knows:
// asking only them, and the registry, no request ever comes back to a node that waits
// on it. The tree is not laid again over the nodes not set aside: a node sets a peer
// aside on its own (that peer was silent to it), and a tree laid without it would move
// this node's place, and so its parent, in every blob the peer comes before it in,
// under a parent nobody else takes it for.
func (s *Source) ancestors(key digest.Digest) []string {
	order, p := s.tree(key)
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	live := func(n string) bool { return !now.Before(s.bad[n]) }
	out := slices.DeleteFunc(up(order, p, s.fanout()), func(n string) bool { return !live(n) })
	if i := slices.IndexFunc(order[:p], live); i >= 0 && !slices.Contains(out, order[i]) {
		out = append(out, order[i])
	}
	return out
}

// fullAncestors are this node's ancestors in key's tree laid over every node, those
// set aside among them, nearest first.
func (s *Source) fullAncestors(key digest.Digest) []string {
	order, p := s.tree(key)
	if p >= len(order) {
		return nil // it serves no peers: every node weighs more, none is its ancestor
	}
	return up(order, p, s.fanout())
}

// turn is one node asked for a blob: a peer (self: the registry), asked how.
type turn struct {
	node string
	how  asking
}

// plan is who to ask for a blob, one after another: this node's ancestors in the
// blob's tree, nearest first (a busy one is left for the next at once; when all were
// busy, all are asked again after pinPoll, for up to busyWait); then the nodes whose
// seeds hold it (HeldPath) and are not set aside, for what they hold only; then the
// registry; then, when the registry fails too (gone), the other nodes once each
// (those set aside last, holders among them): those weighing more asked as ancestors
// are, the others only for what they hold (storedOnly), so that a node joining with
// the registry gone gets a blob from whoever has it.
type plan struct {
	s *Source
	d digest.Digest

	asked     map[string]bool
	chain     []string // the ancestors left to ask in this pass
	busy      []string // the ancestors busy in this pass
	busySince time.Time
	climbed   bool   // the registry's turn came
	rest      []turn // after the registry
	first     []turn // asked before all else (again)
}

// next is the next turn, false when none is left.
func (p *plan) next(ctx context.Context) (turn, bool) {
	if len(p.first) > 0 { // asked already (again)
		t := p.first[0]
		p.first = p.first[1:]
		return t, true
	}
	for !p.climbed {
		for len(p.chain) > 0 {
			n := p.chain[0]
			p.chain = p.chain[1:]
			if !p.asked[n] {
				p.asked[n] = true
				return turn{n, climbing}, true
			}
		}
		// Whom the tree gives now: an ancestor set aside in this pass is skipped, and
		// past a head set aside, the first node of the order not set aside heads.
		for _, n := range p.s.ancestors(p.d) {
			if !p.asked[n] {
				p.chain = append(p.chain, n)
			}
		}
		if len(p.chain) > 0 {
			continue
		}
		if len(p.busy) > 0 {
			busy := p.busy
			p.busy = nil
			if time.Since(p.busySince) < busyWait {
				select {
				case <-ctx.Done():
					return turn{}, false
				case <-time.After(pinPoll):
				}
			} else {
				for _, n := range busy {
					p.s.setAsideBusy(n)
				}
			}
			for _, n := range busy {
				delete(p.asked, n)
			}
			continue
		}
		p.climbed = true
		// Before the registry, the ancestors in the tree over every node that this
		// node set aside for failing (not for wrong bytes, nor for being busy a whole
		// busyWait), once each: one may well be fetching the blob for its own children
		// (only this node found it failing: a connection lost, a stream cut), and this
		// node heading the blob too would have the registry send it twice.
		for _, n := range p.s.fullAncestors(p.d) {
			if !p.asked[n] && p.s.failedAside(n) {
				p.rest = append(p.rest, turn{n, once})
			}
		}
		// The holders set aside are left to others (once, after the registry).
		live, _ := p.s.holders(ctx, p.d, true)
		for _, n := range live {
			if !p.asked[n] {
				p.rest = append(p.rest, turn{n, holding})
			}
		}
		p.rest = append(p.rest, turn{self, once})
		p.rest = append(p.rest, p.others()...)
	}
	for len(p.rest) > 0 {
		t := p.rest[0]
		p.rest = p.rest[1:]
		if !p.asked[t.node] {
			p.asked[t.node] = true
			return t, true
		}
	}
	return turn{}, false
}

// heads tells whether this node heads the blob's tree (the first of its order): its
// turn at the registry is the tree's one copy.
func (p *plan) heads() bool {
	_, pos := p.s.tree(p.d)
	return pos == 0
}

// again has t.node, just asked, asked again next, as t says (it stalled or cut its
// answer: slow, not bad).
func (p *plan) again(t turn) {
	p.first = append(p.first, t)
}

// busyNow notes that node, an ancestor, was busy.
func (p *plan) busyNow(node string) {
	if len(p.busy) == 0 && p.busySince.IsZero() {
		p.busySince = time.Now()
	}
	p.busy = append(p.busy, node)
}

// others are the nodes after the registry: in the blob's order, those set aside last;
// a node weighing more is asked once, one weighing less for what it holds only.
func (p *plan) others() []turn {
	order, pos := p.s.tree(p.d)
	now := time.Now()
	var good, aside []turn
	p.s.mu.Lock()
	for i, n := range order {
		if i == pos {
			continue
		}
		t := turn{n, once}
		if i > pos {
			t.how = storedOnly
		}
		if now.Before(p.s.bad[n]) {
			aside = append(aside, t)
		} else {
			good = append(good, t)
		}
	}
	p.s.mu.Unlock()
	return append(good, aside...)
}
