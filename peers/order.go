package peers

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"

	"github.com/opencontainers/go-digest"
)

// Order is nodes by rendezvous (highest random weight) hashing of key and each node:
// every node computes the same order for a blob, and a node joining or leaving moves
// only the blobs it heads.
func Order(key digest.Digest, nodes []string) []string {
	type scored struct {
		node  string
		score uint64
	}
	s := make([]scored, 0, len(nodes))
	for _, n := range nodes {
		s = append(s, scored{n, weight(key, n)})
	}
	slices.SortFunc(s, func(a, b scored) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		}
		return 0
	})
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = x.node
	}
	return out
}

// weight is node's weight for key: the higher, the earlier in key's order.
func weight(key digest.Digest, node string) uint64 {
	h := sha256.Sum256([]byte(key.String() + "\x00" + node))
	return binary.BigEndian.Uint64(h[:8])
}
