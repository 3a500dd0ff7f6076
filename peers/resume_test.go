package peers

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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

// An ancestor whose stream stops midway, its connection silent too, is slow, not bad
// (a node waiting on its own parent, or short of CPU, looks so): it is asked again
// from where it stopped, for up to busyWait from its first stall with no byte since.
// Stalling once, it sends the rest: the registry sends the blob once (to the head), and
// nobody is set aside. Silent for ever, it is set aside after busyWait and the blob
// comes from the registry.
func TestAnAncestorStallingMidBlob(t *testing.T) {
	for _, tc := range []struct {
		name     string
		stalls   int64 // the head's blob answers that stall
		fromReg  int   // the registry's answers for the blob
		setAside bool
	}{{"once", 1, 1, false}, {"for ever", 1 << 30, 2, true}} {
		t.Run(tc.name, func(t *testing.T) {
			oldStall, oldBusy := stallAfter, busyWait
			stallAfter, busyWait = 200*time.Millisecond, 1500*time.Millisecond
			t.Cleanup(func() { stallAfter, busyWait = oldStall, oldBusy })
			reg := newRegistry(t, 1, 512<<10)
			md := digest.FromBytes(reg.manifest)
			d := reg.largest() // the layer, not the config
			c, head, reader, stalled := misbehavingHead(t, reg, d, "/blobs/"+d.String(), tc.stalls,
				func(k int64, w http.ResponseWriter, r *http.Request, h http.Handler) {
					// The first answer stops after a quarter of the blob, those after it
					// (asked from there) before their first byte.
					left := 0
					if k == 1 {
						left = 128 << 10
					}
					h.ServeHTTP(&stallingWriter{ResponseWriter: w, left: left, done: r.Context().Done()}, r)
				})
			if err := c.pull(head); err != nil { // the head holds the blob
				t.Fatal(err)
			}
			start := time.Now()
			readWhole(t, reader, reg, md, d)
			took := time.Since(start)
			if n := stalled.Load(); n < 2 && tc.setAside || n < 1 {
				t.Fatalf("the head stalled %d times: nothing was tested", n)
			}
			if got := reader.src.isAside(head.addr); got != tc.setAside {
				t.Fatalf("the stalling head set aside: %v, want %v (after %s)", got, tc.setAside, took.Round(time.Millisecond))
			}
			if got := reg.calls[d]; got != tc.fromReg {
				t.Fatalf("the registry answered %d requests for the blob, want %d", got, tc.fromReg)
			}
			if reader.stats.Slow.Load() == 0 {
				t.Fatal("the stall was not counted as a slow peer")
			}
			if tc.setAside && (took < busyWait || took > busyWait+3*time.Second) {
				t.Fatalf("the read took %s behind an ancestor silent for ever, want about busyWait (%s)", took.Round(time.Millisecond), busyWait)
			}
			t.Logf("%s: the head stalled %d times, the read took %s", tc.name, stalled.Load(), took.Round(time.Millisecond))
		})
	}
}

// stallingWriter passes left bytes of an answer, then sends its headers and what it
// passed, and stops until done.
type stallingWriter struct {
	http.ResponseWriter
	left int
	done <-chan struct{}
}

func (s *stallingWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *stallingWriter) Write(p []byte) (int, error) {
	if len(p) <= s.left {
		n, err := s.ResponseWriter.Write(p)
		s.left -= n
		return n, err
	}
	n, _ := s.ResponseWriter.Write(p[:s.left])
	s.left = 0
	http.NewResponseController(s.ResponseWriter).Flush()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
	}
	return n, errors.New("stalled")
}

// An ancestor relaying a blob that ends the answer itself midway (its own source
// failed; it goes on from its next one) is up: it is asked once more from where it
// stopped, not set aside, and the node never goes to the registry itself. Cut a
// second time, it is set aside and the next is asked.
func TestAnAncestorCuttingItsRelay(t *testing.T) {
	for _, tc := range cutOnceOrTwice {
		t.Run(tc.name, func(t *testing.T) {
			reg := newRegistry(t, 1, 1<<20)
			reg.delay = 5 * time.Millisecond // a relay, not the head's own copy
			md := digest.FromBytes(reg.manifest)
			d := reg.largest() // the layer, not the config
			c, head, reader, cut := misbehavingHead(t, reg, d, "/blobs/"+d.String(), tc.cuts,
				func(_ int64, w http.ResponseWriter, r *http.Request, h http.Handler) {
					h.ServeHTTP(&cuttingWriter{ResponseWriter: w, left: 128 << 10}, r)
				})
			// The head pulls the image too: its fill goes on past a reader's cut.
			done := make(chan error, 1)
			go func() { done <- c.pull(head) }()
			readWhole(t, reader, reg, md, d)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if n := cut.Load(); n != tc.cuts {
				t.Fatalf("the head cut %d answers, want %d: nothing was tested", n, tc.cuts)
			}
			if got := reader.src.isAside(head.addr); got != tc.setAside {
				t.Fatalf("the head set aside: %v, want %v", got, tc.setAside)
			}
			reg.mu.Lock()
			calls := reg.calls[d]
			reg.mu.Unlock()
			// The head's fill; and, past the head set aside, the reader's own.
			if want := int(tc.cuts); calls != want {
				t.Fatalf("the registry answered %d requests for the blob, want %d", calls, want)
			}
		})
	}
}

// cuttingWriter passes left bytes of an answer, then ends it (an HTTP/2 stream reset,
// as a handler ending its answer midway sends).
type cuttingWriter struct {
	http.ResponseWriter
	left int
}

func (c *cuttingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

func (c *cuttingWriter) Write(p []byte) (int, error) {
	if len(p) <= c.left {
		n, err := c.ResponseWriter.Write(p)
		c.left -= n
		return n, err
	}
	c.ResponseWriter.Write(p[:c.left])
	http.NewResponseController(c.ResponseWriter).Flush()
	panic(http.ErrAbortHandler)
}

// cutOnceOrTwice: a sender that cuts its answer once is asked again; twice, it is set
// aside.
var cutOnceOrTwice = []struct {
	name     string
	cuts     int64
	setAside bool
}{{"once", 1, false}, {"twice", 2, true}}

// A peer that ends its answer for a manifest before the length it announced (it is up:
// a peer gone refuses the connection) is asked once more, not set aside; cutting it a
// second time, it is set aside and the manifest comes from the next.
func TestAPeerCuttingAManifestShort(t *testing.T) {
	for _, tc := range cutOnceOrTwice {
		t.Run(tc.name, func(t *testing.T) {
			reg := newRegistry(t, 1, 64<<10)
			md := digest.FromBytes(reg.manifest)
			c, head, reader, cut := misbehavingHead(t, reg, md, "/manifests/"+md.String(), tc.cuts,
				func(_ int64, w http.ResponseWriter, _ *http.Request, _ http.Handler) {
					w.Header().Set("Content-Length", strconv.Itoa(len(reg.manifest)))
					w.WriteHeader(http.StatusOK)
					w.Write(reg.manifest[:len(reg.manifest)/2]) // and the handler returns
				})
			if err := c.getManifest(reader); err != nil {
				t.Fatal(err)
			}
			if n := cut.Load(); n != tc.cuts {
				t.Fatalf("the head cut %d answers, want %d: nothing was tested", n, tc.cuts)
			}
			if got := reader.src.isAside(head.addr); got != tc.setAside {
				t.Fatalf("the head set aside: %v, want %v", got, tc.setAside)
			}
		})
	}
}

// misbehavingHead is a cluster of two nodes over reg in which the head of key's order
// answers its first n requests whose path ends in suffix with bad (k counts them from
// 1), the others as usual. It returns the cluster, the head, the other node, and how
// many answers bad gave.
func misbehavingHead(t *testing.T, reg *fakeRegistry, key digest.Digest, suffix string, n int64,
	bad func(k int64, w http.ResponseWriter, r *http.Request, h http.Handler)) (c *cluster, head, other *node, badly *atomic.Int64) {
	badly = new(atomic.Int64)
	var at atomic.Int32
	at.Store(-1)
	wrap := func(i int, h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if int(at.Load()) != i || !strings.HasSuffix(r.URL.Path, suffix) || badly.Load() >= n {
				h.ServeHTTP(w, r)
				return
			}
			bad(badly.Add(1), w, r, h)
		})
	}
	c = newClusterOpts(t, reg, 2, clusterOpts{wrapServer: wrap})
	head, other = c.headAndOther(key)
	at.Store(int32(c.index(head.addr)))
	return c, head, other, badly
}
