package peers

import (
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

// shortStart sets startWait to d for the test.
func shortStart(t *testing.T, d time.Duration) {
	old := startWait
	startWait = d
	t.Cleanup(func() { startWait = old })
}

// stop closes nd's peer server: nothing listens at its address (connections refused).
func (nd *node) stop() {
	nd.peer.Close()
}

// listen serves nd's peers again at its address.
func (nd *node) listen(t *testing.T) {
	t.Helper()
	l, err := net.Listen("tcp", nd.addr)
	if err != nil {
		t.Fatal(err)
	}
	nd.peer = &http.Server{Handler: nd.peer.Handler, TLSConfig: nd.serverTLS.Clone()}
	go nd.peer.ServeTLS(l, "", "")
}

// A node starting a moment after the others (nothing listening at its address yet):
// the others ask it again instead of laying their trees without it, so every blob,
// those it heads among them, still crosses the registry link once.
func TestAPeerListeningLateCostsNoSecondDownload(t *testing.T) {
	reg := newRegistry(t, 8, 256<<10)
	c := newClusterOpts(t, reg, 5, clusterOpts{maxServing: 64})
	// The late node: the one heading the most blobs.
	heads := map[string]int{}
	for d := range reg.blobs {
		heads[Order(d, c.addrs())[0]]++
	}
	late := c.nodes[0]
	for _, nd := range c.nodes {
		if heads[nd.addr] > heads[late.addr] {
			late = nd
		}
	}
	late.stop()
	var wg sync.WaitGroup
	for _, nd := range c.nodes {
		if nd == late {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.pull(nd); err != nil {
				t.Errorf("%s: %v", nd.addr, err)
			}
		}()
	}
	time.Sleep(time.Second)
	late.listen(t)
	if err := c.pull(late); err != nil {
		t.Errorf("the late node: %v", err)
	}
	wg.Wait()
	for d := range reg.blobs {
		if n := reg.calls[d]; n != 1 {
			t.Errorf("the registry was asked %d times for %s", n, d)
		}
	}
	for _, nd := range c.nodes {
		if nd != late && nd.src.isAside(late.addr) {
			t.Errorf("%s set the late node aside", nd.addr)
		}
	}
	t.Logf("the late node heads %d of %d blobs", heads[late.addr], len(reg.blobs))
}

// A peer that never listens costs each node startWait once, not at each request: after
// it, the peer is set aside, and every blob still crosses the registry link once.
func TestAPeerThatNeverListensCostsStartWaitOnce(t *testing.T) {
	shortStart(t, 2*time.Second)
	oldPoll := pinPoll
	pinPoll = 100 * time.Millisecond
	t.Cleanup(func() { pinPoll = oldPoll })
	reg := newRegistry(t, 32, 32<<10)
	c := newClusterOpts(t, reg, 5, clusterOpts{maxServing: 64})
	dead := c.nodes[0]
	dead.stop()
	live := c.nodes[1:]
	heads := 0
	for d := range reg.blobs {
		if Order(d, c.addrs())[0] == dead.addr {
			heads++
		}
	}
	if heads < 4 {
		t.Skip("the dead node heads fewer than 4 blobs of this random image: waiting at each request would not show")
	}
	start := time.Now()
	// Each node reads the blobs one after another: waiting at each request would cost
	// startWait for each blob the dead node heads, one after another.
	c.each(live, c.pull)
	took := time.Since(start)
	if took >= time.Duration(heads)*startWait {
		t.Errorf("the pulls took %s with startWait %s: as long as waiting at each of the %d blobs the dead node heads", took, startWait, heads)
	}
	for _, nd := range live {
		if !nd.src.isAside(dead.addr) {
			t.Errorf("%s did not set the dead node aside", nd.addr)
		}
	}
	for d := range reg.blobs {
		if n := reg.calls[d]; n != 1 {
			t.Errorf("the registry was asked %d times for %s", n, d)
		}
	}
	// Once set aside, and after: no more waiting on it.
	for _, nd := range live {
		nd.src.mu.Lock()
		nd.src.bad[dead.addr] = time.Time{}
		nd.src.mu.Unlock()
	}
	start = time.Now()
	for _, nd := range live {
		if _, _, err := nd.src.Manifest(t.Context(), repo, nil, digest.FromBytes(reg.manifest), -1); err != nil {
			t.Fatal(err)
		}
		if _, err := nd.src.ask(t.Context(), dead.addr, repo, "blobs", nil, c.largest(), 0, climbing, false); err == nil {
			t.Fatal("a stopped peer answered")
		}
	}
	if took := time.Since(start); took > startWait/2 {
		t.Errorf("asking the dead node again took %s", took)
	}
	t.Logf("the first pulls took %s (startWait %s; the dead node heads %d of %d blobs)", took, startWait, heads, len(reg.blobs))
}

// A node taken out (nothing listens at its address) while a node joins: the joiner's
// first requests lay their trees with it, since the aggregator still names it. Once
// the aggregator no longer does, those requests stop waiting for it as for a peer
// starting (startWait) and go on to the nodes that hold the blobs: the joiner, with the
// registry gone, pulls in a moment, not after startWait.
func TestAPeerNoLongerListedIsNotWaitedFor(t *testing.T) {
	shortStart(t, 5*time.Second)
	oldPoll := pinPoll
	pinPoll = 50 * time.Millisecond
	t.Cleanup(func() { pinPoll = oldPoll })
	reg := newRegistry(t, 16, 16<<10)
	c := newClusterOpts(t, reg, 4, clusterOpts{maxServing: 64})
	var mu sync.Mutex
	listed := c.addrs()
	for _, nd := range c.nodes {
		nd.src.Nodes = func() []string { mu.Lock(); defer mu.Unlock(); return listed }
	}
	// The node taken out: the one heading the most blobs (the joiner's ancestor in
	// their trees). The joiner is another.
	heads := map[string]int{}
	for d := range reg.blobs {
		heads[Order(d, c.addrs())[0]]++
	}
	gone := c.nodes[0]
	for _, nd := range c.nodes {
		if heads[nd.addr] > heads[gone.addr] {
			gone = nd
		}
	}
	var joiner *node
	var others []*node
	for _, nd := range c.nodes {
		switch {
		case nd == gone:
		case joiner == nil:
			joiner = nd
		default:
			others = append(others, nd)
		}
	}
	c.each(append(others, gone), c.pull) // every node but the joiner holds the image
	gone.stop()
	reg.down.Store(true)
	go func() {
		time.Sleep(300 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		listed = nil
		for _, a := range c.addrs() {
			if a != gone.addr {
				listed = append(listed, a)
			}
		}
	}()
	start := time.Now()
	if err := c.pull(joiner); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > startWait/2 {
		t.Fatalf("the joiner's pull took %s: it waited for the node taken out after it was no longer listed (startWait %s; it headed %d of %d blobs)",
			took, startWait, heads[gone.addr], len(reg.blobs))
	}
}
