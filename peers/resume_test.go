package peers

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/opencontainers/go-digest"
)

// A sender cut after the blob's last byte (its end never came) leaves the reader with
// every byte and no end: the next node is asked for the blob whole (a range from one
// past the end is unsatisfiable, 416), its bytes skipped, and the blob ends right,
// with no honest node set aside. Three nodes in a chain (fanout 1): the reader asks
// its parent, which cuts, then its grandparent.
func TestASenderCutAfterTheLastByte(t *testing.T) {
	reg := newRegistry(t, 1, 64<<10)
	md := digest.FromBytes(reg.manifest)
	var d digest.Digest
	for d = range reg.blobs {
		break
	}
	var cutter atomic.Int32
	cutter.Store(-1)
	wrap := func(i int, h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if int(cutter.Load()) != i || !strings.HasSuffix(r.URL.Path, "/blobs/"+d.String()) {
				h.ServeHTTP(w, r)
				return
			}
			// Every byte, chunked (no length), then the connection cut: no end.
			w.WriteHeader(http.StatusOK)
			w.Write(reg.blobs[d])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		})
	}
	c := newClusterOpts(t, reg, 3, clusterOpts{wrapServer: wrap, fanout: 1})
	order := Order(d, c.addrs())
	index := func(addr string) int {
		for i, nd := range c.nodes {
			if nd.addr == addr {
				return i
			}
		}
		t.Fatalf("no node %s", addr)
		return -1
	}
	head, reader := c.nodes[index(order[0])], c.nodes[index(order[2])]
	cutter.Store(int32(index(order[1])))
	readWhole(t, reader, reg, md, d)
	if reader.src.isAside(head.addr) {
		t.Fatalf("the head, asked after a sender cut after the last byte, was set aside (for %s)", reader.src.asideFor(head.addr).Round(1e9))
	}
}
