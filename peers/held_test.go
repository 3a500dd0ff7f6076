package peers

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	ggcrlayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/seed"
	"github.com/imagepin/imagepin/status"
)

// seedNode seeds img on c's node i, as imagepinctl seed does.
func (c *cluster) seedNode(i int, img v1.Image) {
	c.t.Helper()
	dir := filepath.Join(c.dir, "media-"+c.nodes[i].addr)
	p, err := ggcrlayout.Write(dir, empty.Index)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := p.AppendImage(img, ggcrlayout.WithAnnotations(map[string]string{ocispec.AnnotationRefName: repo + ":v1"})); err != nil {
		c.t.Fatal(err)
	}
	state := filepath.Join(c.dir, "state-"+strconv.Itoa(i))
	seeder := seed.New(seed.Config{Dir: seed.Dir(state), StoreDir: filepath.Join(c.dir, "node-"+strconv.Itoa(i))}, seed.Deps{Store: c.nodes[i].store})
	if _, err := seeder.Seed(context.Background(), dir); err != nil {
		c.t.Fatal(err)
	}
}

// peerRequests records the requests the nodes serve each other: blobs by asker and
// digest, manifests counted.
type peerRequests struct {
	requests
	manifests atomic.Int64
}

func (q *peerRequests) wrap(i int, h http.Handler) http.Handler {
	return q.requests.wrap(i, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/manifests/") {
			q.manifests.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
}

// mostForOneBlob is the most requests one node made for one blob, one after another.
func (q *peerRequests) mostForOneBlob() int {
	n := map[request]int{}
	most := 0
	for _, r := range q.all() {
		k := request{asker: r.asker, d: r.d}
		n[k]++
		most = max(most, n[k])
	}
	return most
}

// cost is what reading one seeded image on every node but the seeded one cost.
type cost struct {
	nodes, blobs int
	// blobRequests, manifestRequests: served between nodes; summaries: HeldPath asked;
	// registry: requests to the (gone) registry.
	blobRequests, manifestRequests, summaries, registry int64
	// mostForOneBlob: the most requests one node made for one blob.
	mostForOneBlob int
	took           time.Duration
}

// perBlob are the blob requests a node made for a blob, on average.
func (c cost) perBlob() float64 {
	return float64(c.blobRequests) / float64(c.blobs*(c.nodes-1))
}

// summariesPerNode are the summaries a node asked its peers for, on average.
func (c cost) summariesPerNode() float64 {
	return float64(c.summaries) / float64(c.nodes-1)
}

func (c cost) String() string {
	return fmt.Sprintf("%d nodes, %d blobs: %.2f requests a blob a node (at most %d for one blob), %.1f summaries a node, %d manifest requests, %d registry requests, %s",
		c.nodes, c.blobs, c.perBlob(), c.mostForOneBlob, c.summariesPerNode(), c.manifestRequests, c.registry, c.took.Round(time.Millisecond))
}

// seededCost seeds an image of layers blobs on node 0 of n, with no registry at all,
// and has the other nodes read it at once. With warm, each node has its peers'
// summaries before (asked again until every one came: a test counting the blobs'
// requests on a machine too slow for the first dials); they are counted all the same.
func seededCost(t testing.TB, n, layers int, noHolders, warm bool) cost {
	img, err := random.Image(2<<10, int64(layers))
	if err != nil {
		t.Fatal(err)
	}
	reg := registryOf(img)
	reg.down.Store(true)
	q := &peerRequests{}
	c := newClusterOpts(t, reg, n, clusterOpts{wrap: q.wrap, noHolders: noHolders, maxServing: 16})
	c.seedNode(0, img)
	if warm && !noHolders {
		md := digest.FromBytes(reg.manifest)
		for _, nd := range c.nodes[1:] {
			deadline := time.Now().Add(time.Minute)
			for len(nd.src.held.of(context.Background(), c.addrs(), md)) == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("%s: no summary names the seeded manifest after a minute", nd.addr)
				}
				time.Sleep(heldRetry)
			}
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	for _, nd := range c.nodes[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.pull(nd); err != nil {
				t.Errorf("%s: %v", nd.addr, err)
			}
		}()
	}
	wg.Wait()
	out := cost{nodes: n, blobs: len(reg.blobs), blobRequests: int64(len(q.all())), manifestRequests: q.manifests.Load(),
		registry: reg.attempts.Load(), mostForOneBlob: q.mostForOneBlob(), took: time.Since(start)}
	for _, nd := range c.nodes {
		if h := nd.src.held; h != nil {
			h.mu.Lock()
			out.summaries += int64(h.fetches)
			h.mu.Unlock()
		}
	}
	return out
}

// One node of many holds a seed and there is no registry anywhere: every other node
// reads it in about one request a blob (its parent in the blob's tree; the head asks
// the seeded node, whose summary says it holds it), asks the registry nothing and the
// seeded node once for the manifest; without the summaries each manifest costs a node
// a round of its peers, each asking theirs, and each blob's head asks the registry,
// then the others in turn.
func TestOneSeedServesTheClusterInARequestABlob(t *testing.T) {
	const n, layers = 16, 40
	// The counts, not the timing: the summaries are had before the pulls, however slow
	// this machine is (sixteen nodes over TLS in one process, with -race); the cold start
	// is BenchmarkSeededCluster's.
	with := seededCost(t, n, layers, false, true)
	without := seededCost(t, n, layers, true, false)
	t.Logf("with the summaries: %s", with)
	t.Logf("without: %s", without)
	if got := with.perBlob(); got > 1.05 || with.mostForOneBlob > 2 {
		t.Errorf("with the summaries, %.2f requests a blob a node (at most %d for one), want about 1", got, with.mostForOneBlob)
	}
	if got := with.summariesPerNode(); got < n-1 {
		t.Errorf("%.1f summaries a node, want each peer's at least once (%d)", got, n-1)
	}
	if with.registry != 0 {
		t.Errorf("with the summaries, %d requests to the registry, want none", with.registry)
	}
	// A node asks the seeded node for the manifest; again when it was busy (a 503).
	if max := int64(2 * (n - 1)); with.manifestRequests > max {
		t.Errorf("with the summaries, %d manifest requests, want about one a node (%d)", with.manifestRequests, n-1)
	}
	if with.blobRequests+with.manifestRequests >= without.blobRequests+without.manifestRequests {
		t.Errorf("the summaries saved nothing: %d requests with, %d without",
			with.blobRequests+with.manifestRequests, without.blobRequests+without.manifestRequests)
	}
}

// A node's summary is its complete seeds' digests, with an ETag a peer asks again
// with (304 while nothing changed); a new seed changes it.
func TestHeldSummary(t *testing.T) {
	img, err := random.Image(2<<10, 3)
	if err != nil {
		t.Fatal(err)
	}
	reg := registryOf(img)
	c := newCluster(t, reg, 2)
	ctx := context.Background()
	asker := c.nodes[1].src.held
	peer := c.nodes[0].addr
	get := func(etag string) (digestSet, string) {
		t.Helper()
		has, tag, err := asker.get(ctx, peer, etag)
		if err != nil {
			t.Fatal(err)
		}
		return has, tag
	}
	has, tag := get("")
	if len(has) != 0 || tag == "" {
		t.Fatalf("no seed: %d digests, etag %q", len(has), tag)
	}
	if again, tag2 := get(tag); again != nil || tag2 != tag {
		t.Fatalf("nothing changed: %v %q, want a 304", again, tag2)
	}
	c.seedNode(0, img)
	has, tag2 := get(tag)
	if tag2 == tag || len(has) != len(reg.blobs)+1 {
		t.Fatalf("after a seed: %d digests (etag %q), want %d and a new etag", len(has), tag2, len(reg.blobs)+1)
	}
	for d := range reg.blobs {
		if !has.contains(d) {
			t.Fatalf("the summary lacks %s", d)
		}
	}
	if got := asker.of(ctx, []string{peer}, digest.FromBytes(reg.manifest)); len(got) != 1 || got[0] != peer {
		t.Fatalf("holders of the manifest: %v", got)
	}
}

// A summary is read bounded and as data only: digests that do not parse are dropped,
// a body that is not one is an error, and a peer without a node's certificate gets
// none.
func TestHeldSummaryFromABadPeer(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"digests": []string{"sha256:" + strings.Repeat("a", 64), "../../etc", "sha256:short"}})
	}))
	defer srv.Close()
	h := newHoldings(srv.Client(), nil)
	has, _, err := h.get(context.Background(), strings.TrimPrefix(srv.URL, "https://"), "")
	if err != nil || len(has) != 1 {
		t.Fatalf("%v %v: want the one good digest", has, err)
	}
	bad := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("{not json")) }))
	defer bad.Close()
	if _, _, err := newHoldings(bad.Client(), nil).get(context.Background(), strings.TrimPrefix(bad.URL, "https://"), ""); err == nil {
		t.Fatal("a body that is no summary: no error")
	}
	// The peers' server asks for a node's certificate before anything.
	c := newCluster(t, registryOf(mustImage(t)), 1)
	anon := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := anon.Get("https://" + c.nodes[0].addr + HeldPath)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("no client certificate: %s", resp.Status)
	}
}

func mustImage(t *testing.T) v1.Image {
	img, err := random.Image(1<<10, 1)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// The cost of one seed for the whole cluster at larger sizes (go test -bench
// SeededCluster ./peers/): requests a blob a node, with the summaries and without.
func BenchmarkSeededCluster(b *testing.B) {
	for _, n := range []int{10, 50} {
		for _, noHolders := range []bool{false, true} {
			name := fmt.Sprintf("nodes=%d/summaries=%t", n, !noHolders)
			b.Run(name, func(b *testing.B) {
				for range b.N {
					c := seededCost(b, n, 100, noHolders, false)
					b.ReportMetric(c.perBlob(), "requests/blob/node")
					b.ReportMetric(float64(c.mostForOneBlob), "most-requests/blob")
					b.ReportMetric(c.summariesPerNode(), "summaries/node")
					b.ReportMetric(float64(c.registry), "registry-requests")
					b.Logf("%s", c)
				}
			})
		}
	}
}

// storeHoldings is a store's account of the blobs it holds, by image.
type storeHoldings map[string][]status.Blob

func (s storeHoldings) ImageBlobs(image string) ([]status.Blob, string) { return s[image], "" }

// A node's summary names what its store holds of the images it pins, not only its
// seeds: the blobs held, not those it lacks, nor those of an image it does not pin (a
// peer asking for them would be told so, and wait). A fill shows in the summary (and
// its ETag) once it is made again; a summary read back costs 16 bytes a digest.
func TestHeldSummaryNamesWhatTheStoreHolds(t *testing.T) {
	store, err := blobstore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	n := New(Config{}, store, logrus.New())
	d := func(c string) string { return "sha256:" + strings.Repeat(c, 64) }
	app, other := "reg.example/a@"+d("a"), "reg.example/o@"+d("b")
	pinned := map[string]bool{app: true}
	n.pinned.Store(&pinned)
	holds := storeHoldings{
		app:   {{Digest: d("a"), Held: true}, {Digest: d("1"), Held: true}, {Digest: d("2")}},
		other: {{Digest: d("b"), Held: true}, {Digest: d("3"), Held: true}},
	}
	n.SetHoldings(holds)
	h := &heldServer{pinned: n.heldDigests}
	serve := func(etag string) (int, heldSummary, string) {
		t.Helper()
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, HeldPath, nil)
		r.Header.Set("If-None-Match", etag)
		h.ServeHTTP(w, r)
		var sum heldSummary
		if w.Code == http.StatusOK {
			if err := json.Unmarshal(w.Body.Bytes(), &sum); err != nil {
				t.Fatal(err)
			}
		}
		return w.Code, sum, w.Header().Get("ETag")
	}
	code, sum, etag := serve("")
	if code != http.StatusOK || fmt.Sprint(sum.Digests) != fmt.Sprint([]string{d("1"), d("a")}) {
		t.Fatalf("%d %v; want the pinned image's manifest and the layer held", code, sum.Digests)
	}
	if set := newDigestSet(sum.Digests); !set.contains(digest.Digest(d("1"))) || set.contains(digest.Digest(d("2"))) || len(set) != 2 {
		t.Fatalf("read back: %v", set)
	}

	holds[app][2].Held = true // a fill
	if code, _, _ := serve(etag); code != http.StatusNotModified {
		t.Fatalf("within heldRebuild: %d, want the summary as it was", code)
	}
	h.mu.Lock()
	h.at = h.at.Add(-heldRebuild)
	h.mu.Unlock()
	code, sum, etag2 := serve(etag)
	if code != http.StatusOK || etag2 == etag || len(sum.Digests) != 3 {
		t.Fatalf("after a fill: %d %v (etag %s, was %s)", code, sum.Digests, etag2, etag)
	}
}

// A node asks its peers for their summaries only at a turn of its at the registry (the
// head of a digest's order or tree): every node pulling at once, the nodes heading no
// digest get the manifest and every blob from their peers and ask no peer for its
// summary. Asked at every node's first manifest, the summaries were N(N-1) requests,
// each a TLS connection to a peer the node asks for nothing else (39,800 at N = 200).
func TestOnlyAHeadAsksForTheSummaries(t *testing.T) {
	const n = 8
	img, err := random.Image(4<<10, 2)
	if err != nil {
		t.Fatal(err)
	}
	reg := registryOf(img)
	c := newCluster(t, reg, n)
	heads := map[string]bool{}
	heads[Order(digest.FromBytes(reg.manifest), c.addrs())[0]] = true
	for d := range reg.blobs {
		heads[Order(d, c.addrs())[0]] = true
	}
	c.pullAll()
	var others, headsAsked int
	for _, nd := range c.nodes {
		nd.src.held.mu.Lock()
		asked := nd.src.held.fetches
		nd.src.held.mu.Unlock()
		if heads[nd.addr] {
			headsAsked += asked
			continue
		}
		others++
		if asked != 0 {
			t.Errorf("%s heads no digest and asked %d peers for their summaries, want none", nd.addr, asked)
		}
	}
	if others == 0 {
		t.Fatal("every node heads a digest: the test counts nothing")
	}
	if max := len(heads) * (n - 1); headsAsked > max {
		t.Errorf("the %d heads asked %d summaries, want at most one a peer (%d)", len(heads), headsAsked, max)
	}
	t.Logf("%d heads asked %d summaries; %d other nodes none", len(heads), headsAsked, others)
}

// A peer whose summary cannot be had is asked again after heldRetry, twice as long after
// each failure in a row, up to heldFor: not every heldRetry however often the summaries
// are wanted (at 200 nodes starved of CPU, the summaries asked again every 2 s were 9
// in 10 of the requests to peers, each a TLS handshake that timed out again). One that
// answers again is asked at heldFor.
func TestAFailingSummaryIsAskedLessAndLessOften(t *testing.T) {
	oldRetry, oldFor := heldRetry, heldFor
	heldRetry, heldFor = 20*time.Millisecond, 640*time.Millisecond
	t.Cleanup(func() { heldRetry, heldFor = oldRetry, oldFor })
	var asked atomic.Int64
	var fail atomic.Bool
	fail.Store(true)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		if fail.Load() {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		json.NewEncoder(w).Encode(heldSummary{Digests: []digest.Digest{}})
	}))
	defer srv.Close()
	h := newHoldings(srv.Client(), logrus.New())
	nodes := []string{strings.TrimPrefix(srv.URL, "https://")}
	d := digest.FromString("x")
	want := func(long time.Duration) {
		for end := time.Now().Add(long); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
			h.of(context.Background(), nodes, d)
		}
	}
	// Failing for 1.5 s: asked at 0, 20, 60, 140, 300, 620 ms, then every 640 ms.
	want(1500 * time.Millisecond)
	if n := asked.Load(); n > 9 || n < 5 {
		t.Errorf("a failing summary wanted for 1.5 s was asked %d times, want about 7", n)
	}
	fail.Store(false)
	want(heldFor + 100*time.Millisecond) // it answers now
	asked.Store(0)
	want(1500 * time.Millisecond)
	if n := asked.Load(); n > 3 {
		t.Errorf("a summary that came was asked %d times in 1.5 s, want about one every %s", n, heldFor)
	}
}

// A node asks for at most heldAtOnce summaries at once, the peers weighing most in the
// digest first: at its registry turn it asked every peer at once, and at 500 nodes
// short of CPU most of those 499 handshakes timed out.
func TestSummariesAreAskedAFewAtATimeInTheDigestsOrder(t *testing.T) {
	const peersN = 24
	var (
		mu          sync.Mutex
		now, most   int
		first       []string
		client      *http.Client
		nodes       []string
		gate        = make(chan struct{})
		gateOnce    sync.Once
		arrivedHere atomic.Int64
	)
	for range peersN {
		var addr string
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			now++
			most = max(most, now)
			first = append(first, addr)
			mu.Unlock()
			if arrivedHere.Add(1) == int64(heldAtOnce) {
				// Every request but the first heldAtOnce finds the others done.
				time.Sleep(50 * time.Millisecond)
				gateOnce.Do(func() { close(gate) })
			}
			<-gate
			mu.Lock()
			now--
			mu.Unlock()
			json.NewEncoder(w).Encode(heldSummary{Digests: []digest.Digest{}})
		}))
		t.Cleanup(srv.Close)
		addr = strings.TrimPrefix(srv.URL, "https://")
		nodes = append(nodes, addr)
		client = srv.Client()
	}
	h := newHoldings(client, logrus.New())
	d := digest.FromString("x")
	h.of(context.Background(), nodes, d)
	for h.fetchesDone() < peersN {
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if most != heldAtOnce {
		t.Errorf("%d summaries were asked for at once, want %d", most, heldAtOnce)
	}
	want := Order(d, nodes)[:heldAtOnce]
	for _, n := range first[:heldAtOnce] {
		if !slices.Contains(want, n) {
			t.Errorf("%s was asked among the first %d, not one of the peers weighing most in the digest (%v)", n, heldAtOnce, want)
		}
	}
	if len(first) != peersN {
		t.Errorf("%d peers were asked, want every one of the %d", len(first), peersN)
	}
}

// fetchesDone is how many summaries were asked for and answered (or failed).
func (h *holdings) fetchesDone() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, s := range h.by {
		if !s.at.IsZero() {
			n++
		}
	}
	return n
}
