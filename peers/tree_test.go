package peers

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/internal/nodecert"
	"github.com/imagepin/imagepin/mirror"
)

// request is one blob request a node served a peer.
type request struct {
	server, asker int
	d             digest.Digest
	stored        bool // for what it holds only
}

// requests records the blob requests each node serves its peers.
type requests struct {
	mu  sync.Mutex
	got []request
}

func (q *requests) wrap(i int, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/blobs/") && r.TLS != nil {
			name, err := nodecert.Name(r.TLS.VerifiedChains)
			var asker int
			if _, serr := fmt.Sscanf(name, "node-%d", &asker); err == nil && serr == nil {
				q.mu.Lock()
				q.got = append(q.got, request{server: i, asker: asker, d: digest.Digest(path.Base(r.URL.Path)), stored: r.Header.Get(mirror.StoredOnlyHeader) != ""})
				q.mu.Unlock()
			}
		}
		h.ServeHTTP(w, r)
	})
}

func (q *requests) all() []request {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.got)
}

// children are the nodes that asked server for d (whole requests: not for what it
// holds only).
func (q *requests) children(server int, d digest.Digest) []int {
	var out []int
	for _, r := range q.all() {
		if r.server == server && r.d == d && !r.stored && !slices.Contains(out, r.asker) {
			out = append(out, r.asker)
		}
	}
	return out
}

func (c *cluster) addrs() []string {
	var out []string
	for _, nd := range c.nodes {
		out = append(out, nd.addr)
	}
	return out
}

func (c *cluster) index(addr string) int {
	return slices.IndexFunc(c.nodes, func(nd *node) bool { return nd.addr == addr })
}

// getBlob reads blob d through nd's local mirror (its manifest read before).
func (c *cluster) getBlob(nd *node, d digest.Digest) error {
	resp, err := http.Get(nd.local.URL + "/v2/" + repo + "/blobs/" + d.String())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || digest.FromBytes(b) != d {
		return fmt.Errorf("blob %s: status %d, %d bytes, %v", d, resp.StatusCode, len(b), err)
	}
	return nil
}

func (c *cluster) getManifest(nd *node) error {
	md := digest.FromBytes(c.reg.manifest)
	resp, err := http.Get(nd.local.URL + "/v2/" + repo + "/manifests/" + md.String())
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("manifest: %s", resp.Status)
	}
	return nil
}

// largest is the image's largest blob.
func (c *cluster) largest() digest.Digest { return c.reg.largest() }

// largest is the registry's largest blob.
func (r *fakeRegistry) largest() digest.Digest {
	var out digest.Digest
	for d, b := range r.blobs {
		if out == "" || len(b) > len(r.blobs[out]) {
			out = d
		}
	}
	return out
}

// each runs fn for every node at once.
func (c *cluster) each(nodes []*node, fn func(nd *node) error) {
	var wg sync.WaitGroup
	for _, nd := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(nd); err != nil {
				c.t.Errorf("%s: %v", nd.addr, err)
			}
		}()
	}
	wg.Wait()
}

// upward fails the test for a whole request that went to a node weighing less for its
// digest than the node asking: such requests could go round.
func upward(t *testing.T, c *cluster, q *requests) {
	t.Helper()
	for _, r := range q.all() {
		if r.stored {
			continue
		}
		if weight(r.d, c.nodes[r.server].addr) <= weight(r.d, c.nodes[r.asker].addr) {
			t.Errorf("node-%d asked node-%d, which weighs less for %s, for the whole blob", r.asker, r.server, r.d.Encoded()[:12])
		}
	}
}

// Nine nodes pulling one image at once, fanout 2: every node gets every byte, the
// registry is asked once for each blob, every request goes up the blob's order, and
// no node serves a blob to more than two nodes.
func TestATreeOfNineNodes(t *testing.T) {
	reg := newRegistry(t, 4, 512<<10)
	reg.delay = 2 * time.Millisecond
	q := &requests{}
	c := newClusterOpts(t, reg, 9, clusterOpts{wrap: q.wrap, fanout: 2, maxServing: 64})
	c.pullAll()
	for d, n := range reg.calls {
		if n != 1 {
			t.Errorf("the registry was asked %d times for %s", n, d)
		}
	}
	upward(t, c, q)
	addrs := c.addrs()
	for d := range reg.blobs {
		order := Order(d, addrs)
		for i := range c.nodes {
			kids := q.children(i, d)
			if len(kids) > 2 {
				t.Errorf("node-%d served %s to %d nodes: %v", i, d.Encoded()[:12], len(kids), kids)
			}
			// Its children are the ones the tree gives.
			p := slices.Index(order, c.nodes[i].addr)
			for _, k := range kids {
				if kp := slices.Index(order, c.nodes[k].addr); (kp-1)/2 != p {
					t.Errorf("%s: node-%d at %d asked node-%d at %d, not its parent", d.Encoded()[:12], k, kp, i, p)
				}
			}
		}
	}
	var most int64
	for _, nd := range c.nodes {
		most = max(most, nd.stats.ToPeers.Load())
	}
	t.Logf("image %d bytes; the node serving most served %d (%.2f×)", c.size(), most, float64(most)/float64(c.size()))
}

// A fanout as large as the cluster is the star: every node asks each blob's head, and
// the registry is asked once for each blob.
func TestAFanoutAsLargeAsTheClusterIsTheStar(t *testing.T) {
	reg := newRegistry(t, 4, 128<<10)
	q := &requests{}
	c := newClusterOpts(t, reg, 9, clusterOpts{wrap: q.wrap, fanout: 9, maxServing: 64})
	c.pullAll()
	for d, n := range reg.calls {
		if n != 1 {
			t.Errorf("the registry was asked %d times for %s", n, d)
		}
	}
	addrs := c.addrs()
	for _, r := range q.all() {
		if head := Order(r.d, addrs)[0]; c.nodes[r.server].addr != head || r.stored {
			t.Errorf("node-%d asked node-%d for %s, not its head", r.asker, r.server, r.d.Encoded()[:12])
		}
	}
	for d := range reg.blobs {
		head := c.index(Order(d, addrs)[0])
		if kids := q.children(head, d); len(kids) != 8 {
			t.Errorf("the head of %s served %d nodes, want 8", d.Encoded()[:12], len(kids))
		}
	}
}

// A node that dies: the nodes below it in a blob's tree go to its parent (here the
// head), and the blob still crosses the registry link once.
func TestADeadParentsChildrenGoToTheGrandparent(t *testing.T) {
	shortStart(t, 300*time.Millisecond)
	reg := newRegistry(t, 2, 512<<10)
	q := &requests{}
	c := newClusterOpts(t, reg, 9, clusterOpts{wrap: q.wrap, fanout: 2, maxServing: 64})
	c.each(c.nodes, c.getManifest)
	d := c.largest()
	order := Order(d, c.addrs())
	at := func(p int) int { return c.index(order[p]) }
	dead := c.nodes[at(1)]
	dead.peer.Close()
	var live []*node
	for _, nd := range c.nodes {
		if nd != dead {
			live = append(live, nd)
		}
	}
	c.each(live, func(nd *node) error { return c.getBlob(nd, d) })
	if n := reg.calls[d]; n != 1 {
		t.Errorf("the registry was asked %d times for the blob", n)
	}
	upward(t, c, q)
	kids := q.children(at(0), d)
	for _, p := range []int{3, 4} {
		if !slices.Contains(kids, at(p)) {
			t.Errorf("the dead node's child at %d (node-%d) did not ask the head; the head served %v", p, at(p), kids)
		}
		if !c.nodes[at(p)].src.isAside(dead.addr) {
			t.Errorf("node-%d did not set its dead parent aside", at(p))
		}
	}
	t.Logf("the head (node-%d) served %v; the dead node was node-%d", at(0), kids, at(1))
}

// A busy parent (every blob slot taken) costs its child a short wait: it reads from
// the node above, and the registry is still asked once.
func TestABusyParentsChildClimbs(t *testing.T) {
	old := slotWait
	slotWait = 200 * time.Millisecond
	t.Cleanup(func() { slotWait = old })
	reg := newRegistry(t, 2, 256<<10)
	q := &requests{}
	// Fanout 1: a chain, so that the node at 2 has a parent (at 1) and a grandparent.
	c := newClusterOpts(t, reg, 3, clusterOpts{wrap: q.wrap, fanout: 1})
	c.each(c.nodes, c.getManifest)
	d := c.largest()
	order := Order(d, c.addrs())
	head, parent, child := c.nodes[c.index(order[0])], c.nodes[c.index(order[1])], c.nodes[c.index(order[2])]
	if err := c.getBlob(head, d); err != nil {
		t.Fatal(err)
	}
	for range cap(parent.server.slots) {
		parent.server.slots <- struct{}{}
	}
	start := time.Now()
	if err := c.getBlob(child, d); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if took > 3*time.Second {
		t.Errorf("the child took %s behind its busy parent", took)
	}
	if kids := q.children(c.index(head.addr), d); !slices.Contains(kids, c.index(child.addr)) {
		t.Errorf("the child did not read from its grandparent (the head served %v)", kids)
	}
	if n := reg.calls[d]; n != 1 {
		t.Errorf("the registry was asked %d times for the blob", n)
	}
	if child.src.isAside(parent.addr) {
		t.Error("a busy parent was set aside")
	}
	t.Logf("behind a busy parent the child had the blob in %s", took.Round(time.Millisecond))
}

// Nodes that know different peers (each a few of the others) compute different trees,
// yet no whole request goes down a blob's order, so none waits on a node waiting on it:
// every node gets the image promptly.
func TestNoRequestGoesDownWhateverPeersEachKnows(t *testing.T) {
	for _, fanout := range []int{1, 2} {
		t.Run(fmt.Sprintf("fanout%d", fanout), func(t *testing.T) {
			reg := newRegistry(t, 4, 128<<10)
			q := &requests{}
			rng := rand.New(rand.NewPCG(uint64(fanout), 7))
			c := newClusterOpts(t, reg, 9, clusterOpts{wrap: q.wrap, fanout: fanout, maxServing: 64,
				nodes: func(i int, addrs []string) []string {
					known := []string{addrs[i]}
					for _, j := range rng.Perm(len(addrs))[:5] {
						if j != i {
							known = append(known, addrs[j])
						}
					}
					return known
				}})
			start := time.Now()
			c.pullAll()
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("the pulls took %s: nodes waited on each other", took)
			}
			upward(t, c, q)
			var calls int
			for d := range reg.blobs {
				calls += reg.calls[d]
			}
			t.Logf("%d whole blob requests between nodes; the registry sent %d blobs for %d", len(q.all()), calls, len(reg.blobs))
		})
	}
}

// With the registry gone, a node heading a blob in its tree gets it from a node below
// it that holds it (asked for what it holds only), and so do the nodes below it.
func TestTheRegistryGoneAndTheHeadLacksTheBlob(t *testing.T) {
	reg := newRegistry(t, 2, 256<<10)
	q := &requests{}
	c := newClusterOpts(t, reg, 5, clusterOpts{wrap: q.wrap, fanout: 2, maxServing: 64})
	c.each(c.nodes, c.getManifest)
	d := c.largest()
	order := Order(d, c.addrs())
	last := c.nodes[c.index(order[4])]
	// The last node alone fetches the blob (its ancestors fill it for it, and keep it);
	// then every store but its own loses it.
	if err := c.getBlob(last, d); err != nil {
		t.Fatal(err)
	}
	reg.down.Store(true)
	for _, nd := range c.nodes {
		if nd != last {
			if err := nd.store.Delete(t.Context(), d); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.each(c.nodes, func(nd *node) error { return c.getBlob(nd, d) })
	upward(t, c, q)
	var stored bool
	for _, r := range q.all() {
		stored = stored || (r.stored && r.server == c.index(last.addr))
	}
	if !stored {
		t.Error("no node asked the last one for what it holds")
	}
}

// How long one blob takes to reach every node, by fanout: nine nodes serving peers at
// 16 MiB/s each, a 4 MiB blob from a registry at about 40 MiB/s. A star's head sends 8
// copies (about 2 s at 16 MiB/s); a tree's nodes send 1 or 2 (about 0.25 s a level).
//
//	go test ./peers/ -run '^$' -bench Fanout -benchtime 3x
func BenchmarkFanout(b *testing.B) {
	for _, fanout := range []int{1, 2, 3, 9} {
		b.Run(fmt.Sprintf("fanout%d", fanout), func(b *testing.B) {
			var total time.Duration
			for range b.N {
				reg := newRegistry(b, 1, 4<<20)
				reg.delay = 400 * time.Microsecond // 16 KiB a read
				c := newClusterOpts(b, reg, 9, clusterOpts{fanout: fanout, maxServing: 64, bytesPerSecond: 16 << 20})
				c.each(c.nodes, c.getManifest)
				d := c.largest()
				start := time.Now()
				c.each(c.nodes, func(nd *node) error { return c.getBlob(nd, d) })
				total += time.Since(start)
			}
			b.ReportMetric(total.Seconds()/float64(b.N), "s/blob")
		})
	}
}

// Twelve nodes pulling an image of many blobs at once, fanout 2, each node's
// max_serving as many as the blobs it passes on (those whose trees give it children):
// each node is an inner node of about half the blobs' trees, its children asking it
// for each while it arrives, so it serves about twice as many requests as blobs.
// Requests for a blob a node serves already share that blob's slot: no node is ever
// busy, every request goes to the asker's parent (none climbs onto the nodes above),
// and the registry is asked once for each blob. (With a slot a request, parents turned
// children away, the children climbed onto the nodes above, whose slots filled in turn.)
func TestManyBlobsDownTheirTreesAtOnce(t *testing.T) {
	reg := newRegistry(t, 39, 128<<10)
	reg.delay = 100 * time.Millisecond // a blob takes about 0.8 s to cross the registry link
	q := &requests{}
	c := newClusterOpts(t, reg, 12, clusterOpts{wrap: q.wrap, fanout: 2})
	addrs := c.addrs()
	inner := make([]int, len(c.nodes))
	for d := range reg.blobs {
		order := Order(d, addrs)
		for i, nd := range c.nodes {
			if p := slices.Index(order, nd.addr); 2*p+1 < len(order) {
				inner[i]++
			}
		}
	}
	for i, nd := range c.nodes {
		nd.server.slots = make(chan struct{}, max(inner[i], 1))
	}
	c.each(c.nodes, c.getManifest)
	start := time.Now()
	c.each(c.nodes, func(nd *node) error {
		var wg sync.WaitGroup
		errs := make(chan error, len(reg.blobs))
		for d := range reg.blobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := c.getBlob(nd, d); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		return <-errs
	})
	took := time.Since(start)
	for d, n := range reg.calls {
		if n != 1 {
			t.Errorf("the registry was asked %d times for %s", n, d.Encoded()[:12])
		}
	}
	upward(t, c, q)
	most, climbed := 0, 0
	for i := range c.nodes {
		served := 0
		for d := range reg.blobs {
			order := Order(d, addrs)
			p := slices.Index(order, c.nodes[i].addr)
			kids := q.children(i, d)
			served += len(kids)
			for _, k := range kids {
				if kp := slices.Index(order, c.nodes[k].addr); (kp-1)/2 != p {
					climbed++
					t.Errorf("%s: node-%d at %d asked node-%d at %d, not its parent", d.Encoded()[:12], k, kp, i, p)
				}
			}
		}
		most = max(most, served)
	}
	for _, nd := range c.nodes {
		for _, other := range addrs {
			if nd.src.isAside(other) {
				t.Errorf("%s set %s aside", nd.addr, other)
			}
		}
	}
	t.Logf("%d blobs, max_serving %v: the busiest node served %d requests; %d climbed; every node had the image after %s",
		len(reg.blobs), inner, most, climbed, took.Round(time.Millisecond))
}

// A peer this node sets aside moves nothing in a blob's tree: the node keeps its place
// and its parent (every node lays the same tree, whatever each set aside), skips an
// ancestor it set aside for the next one up, and past a head it set aside asks the
// first node of the order it did not set aside (the head's place passes down the
// order), never a node after it.
func TestASetAsidePeerMovesNoNodeInTheTree(t *testing.T) {
	var nodes []string
	for i := range 20 {
		nodes = append(nodes, fmt.Sprintf("10.0.0.%d:5000", i))
	}
	d := digest.FromString("a blob")
	order := Order(d, nodes)
	at := func(self int, aside ...int) []string {
		log := logrus.New()
		log.SetOutput(io.Discard)
		s := NewSource(order[self], func() []string { return nodes }, nil, http.DefaultClient, &Stats{}, log)
		for _, p := range aside {
			s.setAside(order[p], failedFor, errors.New("silent"))
		}
		return s.ancestors(d)
	}
	for _, c := range []struct {
		name  string
		self  int
		aside []int
		want  []int
	}{
		{"none set aside", 13, nil, []int{6, 2, 0}},
		{"a node before it, not its ancestor", 13, []int{1, 3, 5, 7, 8, 9, 10, 11, 12}, []int{6, 2, 0}},
		{"a node after it", 13, []int{14, 19}, []int{6, 2, 0}},
		{"its parent", 13, []int{6}, []int{2, 0}},
		{"its parent and the head", 13, []int{6, 0}, []int{2, 1}},
		{"every ancestor and the head's first child", 13, []int{6, 2, 0, 1}, []int{3}},
		{"every node before it", 4, []int{0, 1, 2, 3}, nil},
		{"the head, from its first child", 1, []int{0}, nil},
		{"the head, from its second child", 2, []int{0}, []int{1}},
		{"the head itself", 0, nil, nil},
	} {
		var want []string
		for _, p := range c.want {
			want = append(want, order[p])
		}
		if got := at(c.self, c.aside...); !slices.Equal(got, want) {
			t.Errorf("%s (the node at %d, %v set aside): asks %v, want %v", c.name, c.self, c.aside, got, want)
		}
	}
}

// A node asking the registry for a blob its tree's head sends (every node above it set
// aside: one copy more from the registry) logs why, once; the head's own turn at the
// registry, the tree's one copy, logs nothing.
func TestAskingTheRegistryPastTheTreeIsLogged(t *testing.T) {
	reg := newRegistry(t, 1, 64<<10)
	c := newCluster(t, reg, 2)
	md := digest.FromBytes(reg.manifest)
	d := reg.largest()
	head, reader := c.headAndOther(d)
	headLog, readerLog := &registryTurns{}, &registryTurns{}
	head.src.Log, reader.src.Log = headLog.logger(), readerLog.logger()
	readWhole(t, head, reg, md, d)
	if n := len(headLog.entries()); n != 0 {
		t.Errorf("the head's turn at the registry logged %d warnings, want none", n)
	}
	reader.src.wrongBytes(head.addr, errors.New("test: sent wrong bytes"))
	readWhole(t, reader, reg, md, d)
	got := readerLog.entries()
	if len(got) != 1 {
		t.Fatalf("a node past its set-aside head logged %d warnings of asking the registry, want 1", len(got))
	}
	if got[0].Data["blob"] != d.String() || !strings.Contains(fmt.Sprint(got[0].Data[logrus.ErrorKey]), "set aside") {
		t.Errorf("the warning names blob %v and says %q; want %s, and that the nodes above are set aside", got[0].Data["blob"], got[0].Data[logrus.ErrorKey], d)
	}
}

// registryTurns keeps the warnings of a node asking the registry past its tree.
type registryTurns struct {
	mu   sync.Mutex
	seen []*logrus.Entry
}

func (r *registryTurns) logger() *logrus.Logger {
	log := logrus.New()
	log.SetOutput(io.Discard)
	log.AddHook(r)
	return log
}

func (r *registryTurns) Levels() []logrus.Level { return []logrus.Level{logrus.WarnLevel} }

func (r *registryTurns) Fire(e *logrus.Entry) error {
	if strings.Contains(e.Message, "asking the registry for a blob") {
		r.mu.Lock()
		r.seen = append(r.seen, e)
		r.mu.Unlock()
	}
	return nil
}

func (r *registryTurns) entries() []*logrus.Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

// Nine nodes pulling one image at once, fanout 2: the manifest goes down its own
// tree, as a blob does. Each node asks its parent in the manifest's order (which asks
// its own, up to the head, which asks the registry once), so the head sends it to its
// two children, not to every node. Every request that travels on goes to a node
// weighing more; a node weighing less is asked for what it holds or its registry has
// only (mirror.HopHeader).
func TestAManifestGoesDownItsTree(t *testing.T) {
	reg := newRegistry(t, 2, 64<<10)
	md := digest.FromBytes(reg.manifest)
	var mu sync.Mutex
	served := map[[2]int]int{} // {server, asker} → manifest requests that may travel on
	var hops int
	wrap := func(i int, h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/manifests/"+md.String()) && r.TLS != nil {
				name, err := nodecert.Name(r.TLS.VerifiedChains)
				var asker int
				if _, serr := fmt.Sscanf(name, "node-%d", &asker); err == nil && serr == nil {
					mu.Lock()
					if r.Header.Get(mirror.HopHeader) != "" {
						hops++
					} else {
						served[[2]int{i, asker}]++
					}
					mu.Unlock()
				}
			}
			h.ServeHTTP(w, r)
		})
	}
	c := newClusterOpts(t, reg, 9, clusterOpts{wrap: wrap, fanout: 2, maxServing: 64})
	c.pullAll()
	if n := reg.calls[md]; n != 1 {
		t.Fatalf("the registry was asked %d times for the manifest, want once for the cluster", n)
	}
	order := Order(md, c.addrs())
	pos := func(i int) int { return slices.Index(order, c.nodes[i].addr) }
	askers := map[int][]int{}
	for k := range served {
		server, asker := k[0], k[1]
		askers[server] = append(askers[server], asker)
		if (pos(asker)-1)/2 != pos(server) {
			t.Errorf("node-%d at %d asked node-%d at %d for the manifest: not its parent in the manifest's tree", asker, pos(asker), server, pos(server))
		}
	}
	for server, a := range askers {
		if len(a) > 2 {
			t.Errorf("node-%d (at %d in the manifest's order) sent the manifest to %d nodes, want its 2 children at most", server, pos(server), len(a))
		}
	}
	head := slices.Index(c.addrs(), order[0])
	t.Logf("the head sent the manifest to %v; %d requests for what a node holds (hops)", askers[head], hops)
	if len(askers[head]) == 0 {
		t.Fatal("nobody asked the head for the manifest: nothing was tested")
	}
}

// A node whose parent in a manifest's tree is gone asks its grandparent (the head
// here), which fetches the manifest from the registry: the manifest still crosses the
// registry link once, and the node gets it.
func TestAManifestPastAParentThatIsGone(t *testing.T) {
	old := startWait
	startWait = 200 * time.Millisecond // a refusing peer is not waited for as one starting
	t.Cleanup(func() { startWait = old })
	reg := newRegistry(t, 1, 64<<10)
	md := digest.FromBytes(reg.manifest)
	c := newClusterOpts(t, reg, 7, clusterOpts{fanout: 2})
	order := Order(md, c.addrs())
	parent, asker := c.nodes[c.index(order[1])], c.nodes[c.index(order[3])]
	parent.peer.Close()
	if err := c.getManifest(asker); err != nil {
		t.Fatal(err)
	}
	if n := reg.calls[md]; n != 1 {
		t.Fatalf("the registry was asked %d times for the manifest, want once (by the head)", n)
	}
	if n := asker.stats.FromRegistry.Load(); n != 0 {
		t.Fatalf("the node read %d bytes from the registry itself, past its grandparent", n)
	}
	if !asker.src.isAside(parent.addr) {
		t.Fatal("the parent that is gone was not set aside")
	}
}
