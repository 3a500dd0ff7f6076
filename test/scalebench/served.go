package main

import (
	"fmt"
	"net/http"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/peers"
)

// served counts what one node's peer server sent, by blob and asker: where a node's
// uploads went, to tell the copies its tree asks of it from the others.
type served struct {
	mu sync.Mutex
	m  map[servedKey]int64
}

type servedKey struct {
	Blob  string
	Asker int // the asking node's index (-1: unknown)
}

// servedEntry is one (blob, asker) of a node, as a worker reports it.
type servedEntry struct {
	Node, Asker int
	Blob        string
	Bytes       int64
}

var nodeCN = regexp.MustCompile(`node-(\d+)$`)

// wrap counts the bytes h writes for each blob request, by the asking node (its client
// certificate's name).
func (s *served) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A blob by its digest; every other answer of the mirror (manifests) by its kind.
		blob := path.Base(r.URL.Path)
		switch {
		case strings.Contains(r.URL.Path, "/blobs/"):
		case strings.Contains(r.URL.Path, "/manifests/"):
			blob = "manifests"
		default:
			blob = "other answers"
		}
		asker := -1
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			if m := nodeCN.FindStringSubmatch(r.TLS.PeerCertificates[0].Subject.CommonName); m != nil {
				asker, _ = strconv.Atoi(m[1])
			}
		}
		cw := &countingWriter{ResponseWriter: w}
		h.ServeHTTP(cw, r)
		s.mu.Lock()
		if s.m == nil {
			s.m = map[servedKey]int64{}
		}
		s.m[servedKey{blob, asker}] += cw.n
		s.mu.Unlock()
	})
}

func (s *served) entries(node int) []servedEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []servedEntry
	for k, v := range s.m {
		out = append(out, servedEntry{Node: node, Asker: k.Asker, Blob: k.Blob, Bytes: v})
	}
	return out
}

type countingWriter struct {
	http.ResponseWriter
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.n += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach the connection's writer (Flush).
func (c *countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// uploadsExplained says where the most uploading node's bytes went: for the five blobs it
// sent most of, how many copies, to whom, and whether each asker is its
// child in the blob's tree laid over every node (as no node has set a peer aside); and,
// over every node, the share of uploaded bytes that went to a tree child.
func uploadsExplained(entries []servedEntry, addrs []string, fanout int, sizes map[string]int64) string {
	if len(entries) == 0 {
		return ""
	}
	byNode := map[int]int64{}
	for _, e := range entries {
		byNode[e.Node] += e.Bytes
	}
	top, most := 0, int64(-1)
	for n, b := range byNode {
		if b > most || (b == most && n < top) {
			top, most = n, b
		}
	}
	// Each blob's tree over every node (as no node has set a peer aside), once: the
	// index of each node's parent in it (-1: the head's, or not a blob).
	index := map[string]int{}
	for i, a := range addrs {
		index[a] = i
	}
	parents := map[string][]int{}
	parentOf := func(blob string, asker int) int {
		ps, ok := parents[blob]
		if !ok {
			if d, err := digest.Parse(blob); err == nil {
				order := peers.Order(d, addrs)
				ps = make([]int, len(addrs))
				for p, a := range order {
					ps[index[a]] = -1
					if p > 0 {
						ps[index[a]] = index[order[(p-1)/fanout]]
					}
				}
			}
			parents[blob] = ps
		}
		if asker < 0 || asker >= len(ps) {
			return -1
		}
		return ps[asker]
	}
	var toChild, all int64
	for _, e := range entries {
		all += e.Bytes
		if parentOf(e.Blob, e.Asker) == e.Node {
			toChild += e.Bytes
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "uploads: %.1f%% of the bytes nodes sent peers went to a child in the blob's tree over every node; the most uploading node, node-%d, sent %.2f MiB",
		100*float64(toChild)/float64(max(all, 1)), top, float64(most)/(1<<20))
	for _, kind := range []string{"manifests", "other answers"} {
		var k int64
		for _, e := range entries {
			if e.Node == top && e.Blob == kind {
				k += e.Bytes
			}
		}
		fmt.Fprintf(&b, ", %s %.3f MiB", kind, float64(k)/(1<<20))
	}
	b.WriteString(":\n")
	perBlob := map[string][]servedEntry{}
	for _, e := range entries {
		if e.Node == top && strings.HasPrefix(e.Blob, "sha256:") {
			perBlob[e.Blob] = append(perBlob[e.Blob], e)
		}
	}
	blobs := make([]string, 0, len(perBlob))
	for bl := range perBlob {
		blobs = append(blobs, bl)
	}
	sum := func(es []servedEntry) (t int64) {
		for _, e := range es {
			t += e.Bytes
		}
		return t
	}
	sort.Slice(blobs, func(i, j int) bool { return sum(perBlob[blobs[i]]) > sum(perBlob[blobs[j]]) })
	for i, bl := range blobs {
		if i == 5 {
			break
		}
		es := perBlob[bl]
		sort.Slice(es, func(i, j int) bool { return es[i].Bytes > es[j].Bytes })
		size := sizes[bl]
		fmt.Fprintf(&b, "  %s (%.2f MiB): %.2f copies:", shortBlob(bl), float64(size)/(1<<20), float64(sum(es))/float64(max(size, 1)))
		for _, e := range es {
			rel := "its child"
			if p := parentOf(bl, e.Asker); p != top {
				rel = fmt.Sprintf("not its child (its parent node-%d)", p)
			}
			fmt.Fprintf(&b, " node-%d %.2f, %s;", e.Asker, float64(e.Bytes)/float64(max(size, 1)), rel)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func shortBlob(b string) string {
	if len(b) > 19 {
		return b[:19]
	}
	return b
}
