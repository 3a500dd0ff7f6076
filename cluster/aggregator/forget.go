package aggregator

import (
	"context"
	"sort"
	"time"

	"github.com/sirupsen/logrus"
)

// Forget drops the nodes the store should no longer show, from memory and (through the
// persister) from the state file: those silent for longer than after (0: none by age),
// and, when cluster is not nil (the names of the cluster's Nodes), those the cluster no
// longer has that are Unknown too (a node that still reports exists, whatever the API
// says, and is kept). It returns the names dropped.
func (s *Store) Forget(after time.Duration, cluster map[string]bool) []string {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var gone []string
	for name, e := range s.nodes {
		silent := now.Sub(e.received)
		if (after > 0 && silent > after) || (cluster != nil && !cluster[name] && e.unknown(now)) {
			delete(s.nodes, name)
			s.dropBlobs(e)
			s.generation++
			s.peers.forget(name, setNames(e))
			if s.dirty == nil {
				s.dirty = map[string]bool{}
			}
			s.dirty[name] = true
			gone = append(gone, name)
		}
	}
	sort.Strings(gone)
	return gone
}

// RunForget drops the nodes silent for longer than after, now and every minute (or
// every after, if shorter), until ctx ends. after <= 0: never.
func (s *Store) RunForget(ctx context.Context, after time.Duration, log logrus.FieldLogger) error {
	if after <= 0 {
		return nil
	}
	t := time.NewTicker(min(time.Minute, after))
	defer t.Stop()
	for {
		if gone := s.Forget(after, nil); len(gone) > 0 {
			log.WithField("nodes", gone).WithField("silent_for", after.String()).Info("forgot nodes that stopped reporting")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
