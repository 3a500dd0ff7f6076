package peers

import (
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/opencontainers/go-digest"
)

// conns records the connections a listener accepted, to drop them all at once.
type conns struct {
	net.Listener
	mu   sync.Mutex
	open []net.Conn
}

func (c *conns) Accept() (net.Conn, error) {
	conn, err := c.Listener.Accept()
	if err == nil {
		c.mu.Lock()
		c.open = append(c.open, conn)
		c.mu.Unlock()
	}
	return conn, err
}

func (c *conns) drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.open {
		conn.Close()
	}
	c.open = nil
}

// A peer whose connection ends before its answer, again and again (its HTTP/2 server
// drops a connection whose first frames it has not read in 2 s, as one short of CPU
// does), is slow, not bad: asked again, never set aside, and the tree holds (the
// registry sends the blob once, to the head). Once this was "unexpected EOF", set aside.
func TestAPeerLosingItsConnectionsIsAskedAgain(t *testing.T) {
	for _, kind := range []string{"manifests", "blobs"} {
		t.Run(kind, func(t *testing.T) {
			reg := newRegistry(t, 1, 256<<10)
			md := digest.FromBytes(reg.manifest)
			d := reg.largest()
			key := d
			if kind == "manifests" {
				key = md
			}
			var at atomic.Int32
			at.Store(-1)
			var dropped atomic.Int64
			listeners := make([]*conns, 2)
			c := newClusterOpts(t, reg, 2, clusterOpts{
				wrapListener: func(i int, l net.Listener) net.Listener {
					listeners[i] = &conns{Listener: l}
					return listeners[i]
				},
				wrapServer: func(i int, h http.Handler) http.Handler {
					return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						if int(at.Load()) == i && strings.HasSuffix(r.URL.Path, "/"+kind+"/"+key.String()) && dropped.Load() < 3 {
							dropped.Add(1)
							listeners[i].drop() // every request on the connection ends with it
							return
						}
						h.ServeHTTP(w, r)
					})
				},
			})
			head, reader := c.headAndOther(key)
			at.Store(int32(c.index(head.addr)))
			if kind == "manifests" {
				if err := c.getManifest(reader); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := c.pull(head); err != nil {
					t.Fatal(err)
				}
				readWhole(t, reader, reg, md, d)
			}
			if n := dropped.Load(); n != 3 {
				t.Fatalf("the head dropped %d connections, want 3: nothing was tested", n)
			}
			if reader.src.isAside(head.addr) {
				t.Fatal("the head was set aside for losing its connections")
			}
			if reader.stats.Slow.Load() < 3 || reader.stats.ConnEvents()["client: connection ended before an answer"] != 3 {
				t.Fatalf("asked again as slow %d times, want 3; connection events %v", reader.stats.Slow.Load(), reader.stats.ConnEvents())
			}
			reg.mu.Lock()
			calls := reg.calls[d]
			reg.mu.Unlock()
			if kind == "blobs" && calls != 1 {
				t.Fatalf("the registry answered %d requests for the blob, want 1 (the head's)", calls)
			}
		})
	}
}
