package peers

import (
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

// slowListener holds the first read of the next `left` connections it accepts for
// delay: a peer whose handshakes come late (its CPU, or its asker's, starved).
type slowListener struct {
	net.Listener
	delay    time.Duration
	left     atomic.Int32
	accepted atomic.Int32
}

func (l *slowListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.accepted.Add(1)
	if l.left.Add(-1) >= 0 {
		return &lateConn{Conn: c, delay: l.delay}, nil
	}
	return c, nil
}

type lateConn struct {
	net.Conn
	delay time.Duration
	once  sync.Once
}

func (c *lateConn) Read(p []byte) (int, error) {
	c.once.Do(func() { time.Sleep(c.delay) })
	return c.Conn.Read(p)
}

// A peer whose handshakes time out (it, or the node asking it, is starved of CPU) is
// slow, not bad: it is asked again, not set aside, and the blobs it heads come from
// it, not from the registry a second time.
//
// The same when the connection takes longer than stallAfter (the request waits for
// the one connection to the peer, and is never sent meanwhile).
func TestASlowHandshakeIsNotSetAside(t *testing.T) {
	for _, tc := range []struct {
		name             string
		handshake, stall time.Duration
	}{{"handshake", 200 * time.Millisecond, stallAfter}, {"no connection before the stall bound", 2 * time.Second, 200 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			oldH, oldS := handshakeWithin, stallAfter
			handshakeWithin, stallAfter = tc.handshake, tc.stall
			t.Cleanup(func() { handshakeWithin, stallAfter = oldH, oldS })
			slowHandshakes(t)
		})
	}
}

func slowHandshakes(t *testing.T) {
	reg := newRegistry(t, 6, 64<<10)
	var slowL *slowListener
	c := newClusterOpts(t, reg, 2, clusterOpts{noHolders: true, wrapListener: func(i int, l net.Listener) net.Listener {
		if i != 0 {
			return l
		}
		slowL = &slowListener{Listener: l, delay: 3 * min(handshakeWithin, stallAfter)}
		return slowL
	}})
	slowNode, reader := c.nodes[0], c.nodes[1]
	if err := c.pull(slowNode); err != nil {
		t.Fatal(err)
	}
	headed := 0
	for d := range reg.blobs {
		if h, _ := c.headAndOther(d); h == slowNode {
			headed++
		}
	}
	if headed == 0 {
		t.Fatal("the slow node heads none of the blobs: the test tells nothing")
	}
	reader.src.Client.CloseIdleConnections() // it asked the slow node for the manifest above a blob
	slowL.left.Store(2)                      // its next two handshakes come late
	if err := c.pull(reader); err != nil {
		t.Fatal(err)
	}
	if reader.src.isAside(slowNode.addr) {
		t.Error("the peer whose handshakes were slow was set aside")
	}
	reg.mu.Lock()
	defer reg.mu.Unlock()
	for d := range reg.blobs {
		if n := reg.calls[d]; n != 1 {
			t.Errorf("the registry was asked %d times for %s (the slow peer heads %d of %d blobs)", n, d, headed, len(reg.blobs))
		}
	}
	if reader.stats.Slow.Load() == 0 {
		t.Error("no request was counted slow")
	}
}

// Requests to a peer with no connection yet share one dial and one handshake
// (HTTP/2): many at once (a node asking a manifest's head for its images, its parent
// for every blob of a set) do not each shake hands.
func TestManyRequestsToAPeerShareOneHandshake(t *testing.T) {
	reg := newRegistry(t, 1, 1<<10)
	var slowL *slowListener
	c := newClusterOpts(t, reg, 2, clusterOpts{noHolders: true, wrapListener: func(i int, l net.Listener) net.Listener {
		if i != 0 {
			return l
		}
		slowL = &slowListener{Listener: l, delay: 300 * time.Millisecond}
		slowL.left.Store(1000) // every handshake comes late: the requests pile up meanwhile
		return slowL
	}})
	peer, asker := c.nodes[0], c.nodes[1]
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := digest.FromString(string(rune('a' + i)))
			resp, err := asker.src.Client.Get("https://" + peer.addr + "/v2/" + repo + "/blobs/" + d.String())
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Error(errors.New("a blob nobody has was served"))
			}
		}()
	}
	wg.Wait()
	if n := slowL.accepted.Load(); n != 1 {
		t.Errorf("20 requests at once to a peer made %d connections, want 1", n)
	}
}

// A node that set its blob's head aside for failing (not for wrong bytes) asks it
// once before fetching the blob from the registry itself: the head may well hold it
// or be fetching it for its own children. A head set aside for wrong bytes is not
// asked.
func TestASetAsideAncestorIsAskedBeforeTheRegistry(t *testing.T) {
	for _, tc := range []struct {
		name  string
		for_  time.Duration
		calls int
	}{{"failed", failedFor, 1}, {"wrong bytes", corruptFor, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			reg := newRegistry(t, 6, 64<<10)
			c := newClusterOpts(t, reg, 2, clusterOpts{noHolders: true})
			var d digest.Digest
			for d = range reg.blobs {
				if h, _ := c.headAndOther(d); h == c.nodes[0] {
					break
				}
			}
			head, reader := c.headAndOther(d)
			if head != c.nodes[0] {
				t.Skip("node-0 heads no blob")
			}
			if err := c.pull(head); err != nil {
				t.Fatal(err)
			}
			reader.src.setAside(head.addr, tc.for_, errors.New("set aside by the test"))
			if err := c.pull(reader); err != nil {
				t.Fatal(err)
			}
			reg.mu.Lock()
			defer reg.mu.Unlock()
			if n := reg.calls[d]; n != tc.calls {
				t.Errorf("the registry was asked %d times for the blob the head set aside heads, want %d", n, tc.calls)
			}
		})
	}
}

// A peer whose every handshake takes three times as long as a request waits for a
// connection (stallAfter): each request stops waiting and the peer is asked again, but
// the handshake under way goes on, and the connection it makes serves the requests
// after. The peer's blobs come from it, over one connection, not from the registry;
// before, the handshake was given up on at its own bound and made again.
func TestASlowHandshakeIsFinishedNotMadeAgain(t *testing.T) {
	busyPeers(t)
	busyWait = 5 * time.Second
	old := stallAfter
	stallAfter = 200 * time.Millisecond
	t.Cleanup(func() { stallAfter = old })
	reg := newRegistry(t, 6, 64<<10)
	var slowL *slowListener
	c := newClusterOpts(t, reg, 2, clusterOpts{noHolders: true, wrapListener: func(i int, l net.Listener) net.Listener {
		if i != 0 {
			return l
		}
		slowL = &slowListener{Listener: l, delay: 3 * stallAfter}
		return slowL
	}})
	slowNode, reader := c.nodes[0], c.nodes[1]
	if err := c.pull(slowNode); err != nil {
		t.Fatal(err)
	}
	reader.src.Client.CloseIdleConnections()
	slowL.left.Store(1 << 20) // every handshake from now on comes late
	before := slowL.accepted.Load()
	if err := c.pull(reader); err != nil {
		t.Fatal(err)
	}
	if reader.src.isAside(slowNode.addr) {
		t.Error("the peer whose handshakes are all slow was set aside")
	}
	if n := slowL.accepted.Load() - before; n != 1 {
		t.Errorf("the reader made %d connections to the slow peer, want 1", n)
	}
	if reader.stats.Slow.Load() == 0 {
		t.Error("no request was counted slow: the test tells nothing")
	}
	reg.mu.Lock()
	defer reg.mu.Unlock()
	for d := range reg.blobs {
		if n := reg.calls[d]; n != 1 {
			t.Errorf("the registry was asked %d times for %s", n, d)
		}
	}
}
