package peers

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/mirror"
	"github.com/imagepin/imagepin/seed"
	"github.com/imagepin/imagepin/test/testcerts"
)

const repo = "registry.example/ocp/release"

// fakeRegistry serves one image from memory, slowly, counting what it is asked.
type fakeRegistry struct {
	manifest []byte
	// children are manifests an index (manifest) names.
	children map[digest.Digest][]byte
	blobs    map[digest.Digest][]byte
	delay    time.Duration
	down     atomic.Bool
	// attempts counts every request, the registry up or down.
	attempts atomic.Int64

	mu    sync.Mutex
	calls map[digest.Digest]int
}

func newRegistry(t testing.TB, layers int, size int64) *fakeRegistry {
	t.Helper()
	img, err := random.Image(size, int64(layers))
	if err != nil {
		t.Fatal(err)
	}
	return registryOf(img)
}

// registryOf is a fake registry serving img.
func registryOf(img v1.Image) *fakeRegistry {
	raw, _ := img.RawManifest()
	r := &fakeRegistry{manifest: raw, blobs: map[digest.Digest][]byte{}, calls: map[digest.Digest]int{}, delay: time.Millisecond}
	cfg, _ := img.RawConfigFile()
	r.blobs[digest.FromBytes(cfg)] = cfg
	ls, _ := img.Layers()
	for _, l := range ls {
		rc, _ := l.Compressed()
		b, _ := io.ReadAll(rc)
		r.blobs[digest.FromBytes(b)] = b
	}
	return r
}

func (r *fakeRegistry) count(d digest.Digest) error {
	r.attempts.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down.Load() {
		return errors.New("connection refused")
	}
	r.calls[d]++
	return nil
}

func (r *fakeRegistry) Manifest(_ context.Context, _ string, _ []digest.Digest, d digest.Digest, _ int64) ([]byte, string, error) {
	if err := r.count(d); err != nil {
		return nil, "", err
	}
	if c, ok := r.children[d]; ok {
		return c, "application/vnd.docker.distribution.manifest.v2+json", nil
	}
	if digest.FromBytes(r.manifest) != d {
		return nil, "", errors.New("manifest unknown")
	}
	return r.manifest, "application/vnd.docker.distribution.manifest.v2+json", nil
}

func (r *fakeRegistry) Blob(_ context.Context, _ string, _ []digest.Digest, d digest.Digest, _ int64) (io.ReadCloser, int64, error) {
	if err := r.count(d); err != nil {
		return nil, 0, err
	}
	b, ok := r.blobs[d]
	if !ok {
		return nil, 0, errors.New("blob unknown")
	}
	return io.NopCloser(&slow{r: bytes.NewReader(b), delay: r.delay}), int64(len(b)), nil
}

type slow struct {
	r     io.Reader
	delay time.Duration
}

func (s *slow) Read(p []byte) (int, error) {
	time.Sleep(s.delay)
	return s.r.Read(p[:min(len(p), 16<<10)])
}

// node is one node's mirror: its local handler (what CRI-O pulls through) and the
// server its peers read.
type node struct {
	addr  string
	store *blobstore.Store
	stats *Stats
	src   *Source
	local *httptest.Server
	peer  *http.Server // Close kills it: listener and connections
	// serverTLS is what peer serves with, untouched by it (a server of the same
	// node listening again takes a copy).
	serverTLS *tls.Config
	// unpinned: the node does not pin the image (yet).
	unpinned atomic.Bool
	server   *Server
}

type cluster struct {
	t     testing.TB
	reg   *fakeRegistry
	nodes []*node
	ca    *testcerts.CA
	dir   string
}

// newCluster starts n nodes pinning the registry's image, each knowing all.
func newCluster(t *testing.T, reg *fakeRegistry, n int) *cluster {
	t.Helper()
	return newClusterWith(t, reg, n, nil)
}

// newClusterWith is newCluster with what each node serves its peers wrapped by wrap
// (nil: as is): a node misbehaving.
func newClusterWith(t *testing.T, reg *fakeRegistry, n int, wrap func(i int, h http.Handler) http.Handler) *cluster {
	t.Helper()
	return newClusterOpts(t, reg, n, clusterOpts{wrap: wrap})
}

// clusterOpts are how a test cluster differs from the usual.
type clusterOpts struct {
	// wrap wraps what node i serves its peers (nil: as is).
	wrap func(i int, h http.Handler) http.Handler
	// wrapServer wraps node i's whole peer server (its bounds and progress included).
	wrapServer func(i int, h http.Handler) http.Handler
	// fanout is each Source's (0: the default); maxServing each server's (0: 4).
	fanout, maxServing int
	// bytesPerSecond bounds what each node serves its peers (0: no bound).
	bytesPerSecond int64
	// nodes are the peers node i knows (nil: all).
	nodes func(i int, addrs []string) []string
	// noHolders: the nodes ask no peer what its seeds hold (HeldPath).
	noHolders bool
	// wrapListener wraps node i's peer listener (nil: as is).
	wrapListener func(i int, l net.Listener) net.Listener
}

func newClusterOpts(t testing.TB, reg *fakeRegistry, n int, o clusterOpts) *cluster {
	t.Helper()
	wrap := o.wrap
	if o.maxServing == 0 {
		o.maxServing = 4
	}
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "nodes-ca")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, reg: reg, ca: ca, dir: dir}
	var addrs []string
	listeners := make([]net.Listener, n)
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, l.Addr().String())
		if o.wrapListener != nil {
			l = o.wrapListener(i, l)
		}
		listeners[i] = l
	}
	md := digest.FromBytes(reg.manifest)
	for i := range n {
		name := fmt.Sprintf("node-%d", i)
		serving, err := ca.NodeServing(dir, name, net.ParseIP("127.0.0.1"))
		if err != nil {
			t.Fatal(err)
		}
		clientCert, err := ca.Node(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		client, err := Client(clientCert, "", ca.File)
		if err != nil {
			t.Fatal(err)
		}
		srvTLS, err := ServerTLS(serving, "", ca.File)
		if err != nil {
			t.Fatal(err)
		}
		store, err := blobstore.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		log := logrus.New().WithField("node", name)
		stats := &Stats{}
		nd := &node{addr: addrs[i], store: store, stats: stats}
		m := mirror.New(store, func(_ string, d digest.Digest) bool { return d == md && !nd.unpinned.Load() }, log)
		t.Cleanup(m.Close)
		reg := CountRegistry(reg, stats)
		known := addrs
		if o.nodes != nil {
			known = o.nodes(i, addrs)
		}
		nd.src = NewSource(addrs[i], func() []string { return known }, reg, client, stats, log)
		nd.src.Fanout = o.fanout
		if o.noHolders {
			nd.src.held = nil
		}
		src := nd.src
		nd.local = httptest.NewServer(m.Handler(src, &mirror.Stats{}))
		var peerHandler http.Handler = m.PeerHandler(reg, src, &mirror.Stats{})
		if wrap != nil {
			peerHandler = wrap(i, peerHandler)
		}
		server := &Server{Mirror: peerHandler, SeedsDir: seed.Dir(filepath.Join(dir, "state-"+strconv.Itoa(i))), MaxServing: o.maxServing,
			BytesPerSecond: o.bytesPerSecond, Stats: stats, Log: log}
		server.init()
		nd.server = server
		nd.serverTLS = srvTLS.Clone()
		var serverHandler http.Handler = server
		if o.wrapServer != nil {
			serverHandler = o.wrapServer(i, server)
		}
		nd.peer = &http.Server{Handler: serverHandler, TLSConfig: srvTLS}
		go nd.peer.ServeTLS(listeners[i], "", "")
		t.Cleanup(nd.local.Close)
		t.Cleanup(func() { nd.peer.Close() })
		c.nodes = append(c.nodes, nd)
	}
	return c
}

// pull fetches the image's manifest and every blob through nd's local mirror, as
// CRI-O does, and checks every byte.
func (c *cluster) pull(nd *node) error {
	md := digest.FromBytes(c.reg.manifest)
	get := func(kind string, d digest.Digest) error {
		resp, err := http.Get(nd.local.URL + "/v2/" + repo + "/" + kind + "/" + d.String())
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return fmt.Errorf("%s %s: %w", kind, d, err)
		}
		if resp.StatusCode != http.StatusOK || digest.FromBytes(b) != d {
			return fmt.Errorf("%s %s: status %d, %d bytes that do not match", kind, d, resp.StatusCode, len(b))
		}
		return nil
	}
	if err := get("manifests", md); err != nil {
		return err
	}
	for d := range c.reg.blobs {
		if err := get("blobs", d); err != nil {
			return err
		}
	}
	return nil
}

func (c *cluster) pullAll() {
	var wg sync.WaitGroup
	for _, nd := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.pull(nd); err != nil {
				c.t.Errorf("%s: %v", nd.addr, err)
			}
		}()
	}
	wg.Wait()
}

func (c *cluster) size() int64 {
	n := int64(len(c.reg.manifest))
	for _, b := range c.reg.blobs {
		n += int64(len(b))
	}
	return n
}

// Three nodes pulling the same image at once: the registry is asked once for each
// blob in the whole cluster, and every node gets every byte right.
func TestOneDownloadPerBlobForTheCluster(t *testing.T) {
	reg := newRegistry(t, 6, 256<<10)
	c := newCluster(t, reg, 3)
	c.pullAll()
	var fromRegistry, fromPeers, toPeers int64
	for _, nd := range c.nodes {
		fromRegistry += nd.stats.FromRegistry.Load()
		fromPeers += nd.stats.FromPeers.Load()
		toPeers += nd.stats.ToPeers.Load()
	}
	for d, n := range reg.calls {
		if n != 1 {
			t.Errorf("the registry was asked %d times for %s", n, d)
		}
	}
	t.Logf("image %d bytes; from the registry %d (%.2f×), between nodes %d", c.size(), fromRegistry, float64(fromRegistry)/float64(c.size()), fromPeers)
	if fromRegistry != c.size() {
		t.Fatalf("the cluster read %d bytes from the registry for an image of %d", fromRegistry, c.size())
	}
	// Counted by image too (the pinned manifest's reference), for the sets' status.
	var byImage int64
	for _, nd := range c.nodes {
		byImage += nd.stats.RegistryBytes(repo + "@" + digest.FromBytes(reg.manifest).String())
	}
	if byImage != c.size() {
		t.Fatalf("by image: %d bytes from the registry, want %d", byImage, c.size())
	}
	if fromPeers < 2*c.size()*9/10 || toPeers < fromPeers {
		t.Fatalf("between nodes: %d read, %d served; two of three nodes read the image from peers (%d)", fromPeers, toPeers, 2*c.size())
	}
}

// The registry gone after the first nodes pulled: a node that joins reads everything
// from its peers.
func TestANodeJoiningAfterTheRegistryIsGone(t *testing.T) {
	reg := newRegistry(t, 4, 128<<10)
	c := newCluster(t, reg, 3)
	for _, nd := range c.nodes[:2] {
		if err := c.pull(nd); err != nil {
			t.Fatal(err)
		}
	}
	reg.down.Store(true)
	// The late node's own pulls: it served the first two the blobs it heads before
	// (fetching them from the registry for them), and kept them.
	late := c.nodes[2]
	fromPeers := late.stats.FromPeers.Load()
	if err := c.pull(late); err != nil {
		t.Fatalf("with the registry gone, the late node: %v", err)
	}
	t.Logf("the late node read %d bytes from its peers", late.stats.FromPeers.Load()-fromPeers)
	if late.stats.FromPeers.Load() == fromPeers {
		t.Fatal("the late node read nothing from its peers")
	}
}

// firstOf is a blob whose rendezvous order puts owner first and reader elsewhere.
func (c *cluster) blobHeadedBy(owner *node) digest.Digest {
	var addrs []string
	for _, nd := range c.nodes {
		addrs = append(addrs, nd.addr)
	}
	for d := range c.reg.blobs {
		if Order(d, addrs)[0] == owner.addr && len(c.reg.blobs[d]) > 200<<10 {
			return d
		}
	}
	c.t.Skip("no large blob headed by that node in this random image")
	return ""
}

// A peer dying mid-transfer costs nothing visible: the reader resumes from the next
// node with Range, and gets every byte right.
func TestAPeerDyingMidTransfer(t *testing.T) {
	reg := newRegistry(t, 8, 512<<10)
	reg.delay = 5 * time.Millisecond // 16 KiB each 5 ms: about 160 ms a blob
	c := newCluster(t, reg, 3)
	owner, reader := c.nodes[1], c.nodes[0]
	d := c.blobHeadedBy(owner)
	// The reader learns the manifest; then reads the owner's blob, which dies midway.
	md := digest.FromBytes(reg.manifest)
	resp, err := http.Get(reader.local.URL + "/v2/" + repo + "/manifests/" + md.String())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	go func() {
		for owner.stats.ToPeers.Load() < 64<<10 {
			time.Sleep(time.Millisecond)
		}
		owner.peer.Close()
	}()
	resp, err = http.Get(reader.local.URL + "/v2/" + repo + "/blobs/" + d.String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || digest.FromBytes(b) != d {
		t.Fatalf("after the owner died mid-transfer: %d bytes, %v", len(b), err)
	}
	sent := owner.stats.ToPeers.Load()
	if sent >= int64(len(b)) {
		t.Fatalf("the owner sent the whole blob (%d bytes) before it died: nothing was tested", sent)
	}
	t.Logf("the owner died after sending %d of %d bytes; the reader resumed elsewhere", sent, len(b))
	if !c.nodes[0].src.isAside(owner.addr) {
		t.Fatal("the dead peer was not set aside")
	}
}

// A peer serving wrong bytes (its stored copy corrupted on disk): the reader's copy is
// cut once (never given whole), the peer is set aside, and the retry gets every byte
// right from elsewhere.
func TestAPeerServingGarbage(t *testing.T) {
	reg := newRegistry(t, 6, 256<<10)
	c := newCluster(t, reg, 3)
	owner, reader := c.nodes[2], c.nodes[0]
	d := c.blobHeadedBy(owner)
	if err := c.pull(owner); err != nil {
		t.Fatal(err)
	}
	// Corrupt the owner's stored blob on disk.
	path := filepath.Join(c.dir, "node-2", "blobs", "sha256", d.Encoded())
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	first := c.pull(reader)
	if first == nil {
		t.Fatal("the reader took a corrupted blob as whole")
	}
	t.Logf("first pull, cut as it should be: %v", first)
	if !reader.src.isAside(owner.addr) {
		t.Fatal("the peer that served garbage was not set aside")
	}
	if err := c.pull(reader); err != nil {
		t.Fatalf("the retry: %v", err)
	}
}

// Only nodes: a client without a node certificate gets 403; with one, more requests
// than MaxServing at once get 503 (the client asks the next node).
func TestServingNodesOnlyAndBounded(t *testing.T) {
	reg := newRegistry(t, 1, 64<<10)
	c := newCluster(t, reg, 1)
	url := "https://" + c.nodes[0].addr + "/v2/"
	plain, err := c.ca.HTTPClient("")
	if err != nil {
		t.Fatal(err)
	}
	user, err := c.ca.Client(c.dir, "user", "alice", "developers")
	if err != nil {
		t.Fatal(err)
	}
	asUser, err := c.ca.HTTPClient(user)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := plain.Get(url); err == nil {
		resp.Body.Close()
		t.Fatalf("no client certificate: %s", resp.Status)
	}
	resp, err := asUser.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a user's certificate: %s, want 403", resp.Status)
	}
	nodeCert, _ := c.ca.Node(c.dir, "other")
	asNode, _ := c.ca.HTTPClient(nodeCert)
	resp, err = asNode.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a node's certificate: %s", resp.Status)
	}
	// Fill every slot with a request that holds it.
	old := slotWait
	slotWait = 100 * time.Millisecond
	t.Cleanup(func() { slotWait = old })
	s := &Server{Mirror: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }), MaxServing: 2, Stats: &Stats{}}
	s.init()
	for range 2 {
		s.slots <- struct{}{}
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/v2/", nil)
	req.TLS = resp.TLS
	s.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("over MaxServing: %d, want 503", rec.Code)
	}
}

// The same order on every node, and blobs spread over the nodes.
func TestOrderIsStableAndSpread(t *testing.T) {
	nodes := []string{"10.0.0.1:7444", "10.0.0.2:7444", "10.0.0.3:7444", "10.0.0.4:7444"}
	heads := map[string]int{}
	for i := range 4000 {
		d := digest.FromString(fmt.Sprint(i))
		a := Order(d, nodes)
		b := Order(d, []string{nodes[3], nodes[1], nodes[0], nodes[2]})
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("the order depends on the list's order: %v %v", a, b)
		}
		heads[a[0]]++
	}
	for n, h := range heads {
		if h < 800 || h > 1200 {
			t.Errorf("%s heads %d of 4000 blobs", n, h)
		}
	}
}

// The server paces what it sends to BytesPerSecond.
func TestServeRateIsBounded(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 1<<20)
	s := &Server{Mirror: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(body) }),
		MaxServing: 1, BytesPerSecond: 2 << 20, Stats: &Stats{}}
	s.init()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/v2/", nil)
	nodeCert := c0(t)
	req.TLS = nodeCert
	// Drain the initial burst first, then 1 MiB at 2 MiB/s takes about half a second.
	s.limiter.AllowN(time.Now(), burst)
	start := time.Now()
	s.ServeHTTP(rec, req)
	took := time.Since(start)
	if rec.Body.Len() != len(body) || took < 300*time.Millisecond {
		t.Fatalf("1 MiB at 2 MiB/s: %d bytes in %s", rec.Body.Len(), took)
	}
	if s.Stats.ToPeers.Load() != int64(len(body)) {
		t.Fatalf("counted %d bytes to peers", s.Stats.ToPeers.Load())
	}
}

// c0 is the TLS state of a request from a node (a verified node client certificate).
func c0(t *testing.T) *tls.ConnectionState {
	t.Helper()
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	p, err := ca.Node(dir, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(p, p)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf, ca.Cert}}}
}

// Nodes pin the same set a moment apart: a node asked before it pins is asked again,
// and the registry still sends each blob once.
func TestAPeerThatPinsAMomentLater(t *testing.T) {
	reg := newRegistry(t, 6, 128<<10)
	c := newCluster(t, reg, 3)
	late := c.nodes[2]
	late.unpinned.Store(true)
	pinned := make(chan struct{})
	go func() {
		time.Sleep(time.Second)
		late.unpinned.Store(false)
		close(pinned)
	}()
	// The late node heads some of the blobs (it waits for them) or none (about 6% of
	// random images: the test then shows nothing more than one download per blob).
	var heads int
	for d := range reg.blobs {
		if Order(d, []string{c.nodes[0].addr, c.nodes[1].addr, late.addr})[0] == late.addr {
			heads++
		}
	}
	start := time.Now()
	for _, nd := range c.nodes[:2] {
		if err := c.pull(nd); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("the late node heads %d of %d blobs; the first two nodes had the image after %s", heads, len(reg.blobs), time.Since(start).Round(time.Millisecond))
	<-pinned // the late node pins the image, then pulls it
	if err := c.pull(late); err != nil {
		t.Fatal(err)
	}
	for d, n := range reg.calls {
		if n != 1 {
			t.Errorf("the registry was asked %d times for %s", n, d)
		}
	}
}

// A peer that does not pin the image at all costs pinWait once, not on every request.
func TestAPeerThatDoesNotPinTheImage(t *testing.T) {
	old := pinWait
	// One wait is 1 s; waiting on every digest node-1 heads (about half of 8) takes 4 s.
	// The bound sits between, with room for -race on a loaded machine.
	pinWait = time.Second
	t.Cleanup(func() { pinWait = old })
	reg := newRegistry(t, 6, 64<<10)
	c := newCluster(t, reg, 2)
	c.nodes[1].unpinned.Store(true)
	start := time.Now()
	if err := c.pull(c.nodes[0]); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*pinWait+pinWait/2 {
		t.Fatalf("the pull took %s: the peer that does not pin the image was waited for more than once", took)
	}
	// Node-0 asked node-1 if node-1 heads any digest of the image (all but about 0.4% of
	// random images).
	addrs := []string{c.nodes[0].addr, c.nodes[1].addr}
	asked := Order(digest.FromBytes(reg.manifest), addrs)[0] == addrs[1]
	for d := range reg.blobs {
		asked = asked || Order(d, addrs)[0] == addrs[1]
	}
	if asked && !c.nodes[0].src.isNotPinning(c.nodes[1].addr, digest.FromBytes(reg.manifest)) {
		t.Fatal("the peer was not taken for one that does not pin the image")
	}
}

func (s *Source) isNotPinning(node string, root digest.Digest) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Now().Before(s.notPinning[[2]string{node, root.String()}])
}

// A busy peer (every serving slot taken) is asked again rather than the registry.
func TestABusyPeerIsAskedAgain(t *testing.T) {
	old := slotWait
	slotWait = 100 * time.Millisecond
	t.Cleanup(func() { slotWait = old })
	reg := newRegistry(t, 6, 128<<10)
	c := newCluster(t, reg, 2)
	if err := c.pull(c.nodes[1]); err != nil {
		t.Fatal(err)
	}
	busy := c.nodes[1].server
	for range cap(busy.slots) {
		busy.slots <- struct{}{}
	}
	go func() {
		time.Sleep(1500 * time.Millisecond)
		for range cap(busy.slots) {
			<-busy.slots
		}
	}()
	before := map[digest.Digest]int{}
	for d, n := range reg.calls {
		before[d] = n
	}
	if err := c.pull(c.nodes[0]); err != nil {
		t.Fatal(err)
	}
	var again int
	for d, n := range reg.calls {
		if n > before[d] {
			again++
		}
	}
	if c.nodes[0].stats.FromPeers.Load() == 0 || again > 0 {
		t.Fatalf("node-0 read %d bytes from its busy peer and asked the registry again for %d digests", c.nodes[0].stats.FromPeers.Load(), again)
	}
	t.Logf("with its peer busy for 1.5 s, node-0 asked the registry again for %d digests and read %d bytes from the peer", again, c.nodes[0].stats.FromPeers.Load())
}

func (s *Source) asideFor(node string) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Until(s.bad[node])
}

// A peer announcing a blob far larger than the manifest gives is refused before
// anything is read; one streaming on past it is cut at the blob's size. Either is set
// aside as a peer sending wrong bytes (corruptFor), and the pull's retry is right. The
// bytes read are counted once the peer's handler has returned (the transfer is over,
// the fill behind the pull too): read straight from the Source (its own bound), and
// through a node's mirror (which bounds what it reads again).
func TestAPeerSendingMoreThanTheManifestGives(t *testing.T) {
	for _, c := range []struct {
		name     string
		announce bool
	}{{"announcing 48 MiB", true}, {"streaming 48 MiB", false}} {
		t.Run(c.name, func(t *testing.T) {
			reg := newRegistry(t, 6, 256<<10)
			var sent, serving atomic.Int64
			bad := func(i int, h http.Handler) http.Handler {
				if i != 1 {
					return h
				}
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if !strings.Contains(r.URL.Path, "/blobs/") {
						h.ServeHTTP(w, r)
						return
					}
					serving.Add(1)
					defer serving.Add(-1)
					if c.announce {
						w.Header().Set("Content-Length", strconv.Itoa(48<<20))
					}
					w.WriteHeader(http.StatusOK)
					chunk := make([]byte, 64<<10)
					for range (48 << 20) / len(chunk) {
						n, err := w.Write(chunk)
						sent.Add(int64(n))
						if err != nil {
							return
						}
					}
				})
			}
			// over waits until the peer's handlers have returned: nothing more comes.
			over := func() {
				t.Helper()
				deadline := time.Now().Add(30 * time.Second)
				for serving.Load() > 0 {
					if time.Now().After(deadline) {
						t.Fatal("the peer still sends 30 s after the reader was done")
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			cl := newClusterWith(t, reg, 2, bad)
			liar := cl.nodes[1]
			d := cl.blobHeadedBy(liar)
			size := int64(len(reg.blobs[d]))
			reader := cl.nodes[0]
			md := digest.FromBytes(reg.manifest)

			// Straight from the Source: the peer first (it heads d), then the registry.
			rc, _, err := reader.src.Blob(context.Background(), repo, []digest.Digest{md}, d, size)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			over()
			t.Logf("from the Source: %d bytes, %v; the peer wrote %d bytes", len(got), err, sent.Load())
			if fromPeer := reader.stats.FromPeers.Load(); fromPeer > size+1 {
				t.Fatalf("%d bytes read from the peer for a blob of %d", fromPeer, size)
			}
			if aside := reader.src.asideFor(liar.addr); aside <= failedFor {
				t.Fatalf("the peer is set aside for %s, want %s", aside, corruptFor)
			}

			// Through the node's mirror, the peer asked again.
			reader.src.mu.Lock()
			delete(reader.src.bad, liar.addr)
			reader.src.mu.Unlock()
			before := reader.stats.FromPeers.Load()
			first := cl.pull(reader)
			over()
			t.Logf("first pull: %v; the peer wrote %d bytes", first, sent.Load())
			if got := reader.stats.FromPeers.Load() - before; got > cl.size() {
				t.Fatalf("%d bytes read from the peer for a blob of %d (the image is %d)", got, size, cl.size())
			}
			if aside := reader.src.asideFor(liar.addr); aside <= failedFor {
				t.Fatalf("the peer is set aside for %s, want %s", aside, corruptFor)
			}
			if first != nil {
				if err := cl.pull(reader); err != nil {
					t.Fatalf("the retry: %v", err)
				}
			}
		})
	}
}

// countBodies counts the bytes read from the bodies of responses whose URL holds path.
type countBodies struct {
	base http.RoundTripper
	path string
	n    *atomic.Int64
}

func (c countBodies) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(r)
	if err == nil && strings.Contains(r.URL.Path, c.path) {
		resp.Body = struct {
			io.Reader
			io.Closer
		}{&countReader{resp.Body, c.n}, resp.Body}
	}
	return resp, err
}

type countReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// A peer sending far more than the size an index gives its child manifest (3 MiB,
// under the 4 MiB every manifest is bounded by), announced or streamed: the asking node
// reads no more than that size and a byte, sets the peer aside as one sending wrong
// bytes, and has the manifest from the next (the registry).
func TestAPeerSendingMoreThanTheIndexGivesAManifest(t *testing.T) {
	for _, c := range []struct {
		name     string
		announce bool
	}{{"announcing 3 MiB", true}, {"streaming 3 MiB", false}} {
		t.Run(c.name, func(t *testing.T) {
			img, err := random.Image(16<<10, 2)
			if err != nil {
				t.Fatal(err)
			}
			reg := registryOf(img)
			raw := reg.manifest
			child := digest.FromBytes(raw)
			reg.children = map[digest.Digest][]byte{child: raw}
			reg.manifest = []byte(fmt.Sprintf(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.docker.distribution.manifest.v2+json","digest":%q,"size":%d}]}`, child, len(raw)))
			index := digest.FromBytes(reg.manifest)
			liar := -1
			bad := func(i int, h http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if i != liar || !strings.HasSuffix(r.URL.Path, "/manifests/"+child.String()) {
						h.ServeHTTP(w, r)
						return
					}
					if c.announce {
						w.Header().Set("Content-Length", strconv.Itoa(3<<20))
					}
					w.WriteHeader(http.StatusOK)
					chunk := make([]byte, 64<<10)
					for range (3 << 20) / len(chunk) {
						if _, err := w.Write(chunk); err != nil {
							return
						}
					}
				})
			}
			cl := newClusterWith(t, reg, 2, bad)
			liar = 0
			if Order(child, []string{cl.nodes[0].addr, cl.nodes[1].addr})[0] == cl.nodes[1].addr {
				liar = 1
			}
			reader := cl.nodes[1-liar]
			var read atomic.Int64
			reader.src.Client = &http.Client{Transport: countBodies{reader.src.Client.Transport, "/manifests/" + child.String(), &read}}
			data, _, err := reader.src.Manifest(context.Background(), repo, []digest.Digest{index}, child, int64(len(raw)))
			if err != nil || !bytes.Equal(data, raw) {
				t.Fatalf("the child manifest: %d bytes, %v", len(data), err)
			}
			if n := read.Load(); n > int64(len(raw))+1 {
				t.Fatalf("%d bytes read from the peer for a manifest of %d", n, len(raw))
			}
			if aside := reader.src.asideFor(cl.nodes[liar].addr); aside <= failedFor {
				t.Fatalf("the peer is set aside for %s, want %s", aside, corruptFor)
			}
		})
	}
}

// A peer that stops sending a manifest midway is left after stallAfter (set aside),
// and the manifest comes from the next in the order: it does not hold the fetch, and
// every request joined to it, for ever.
func TestAPeerStallingOnAManifest(t *testing.T) {
	old := stallAfter
	stallAfter = 200 * time.Millisecond
	t.Cleanup(func() { stallAfter = old })
	reg := newRegistry(t, 2, 64<<10)
	md := digest.FromBytes(reg.manifest)
	var staller atomic.Int64
	staller.Store(-1)
	stall := func(i int, h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if staller.Load() != int64(i) || !strings.Contains(r.URL.Path, "/manifests/") {
				h.ServeHTTP(w, r)
				return
			}
			w.Header().Set("Content-Length", strconv.Itoa(len(reg.manifest)))
			w.WriteHeader(http.StatusOK)
			w.Write(reg.manifest[:10])
			http.NewResponseController(w).Flush()
			select { // stalls (for long enough to tell)
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		})
	}
	c := newClusterWith(t, reg, 2, stall)
	addrs := []string{c.nodes[0].addr, c.nodes[1].addr}
	first := Order(md, addrs)[0]
	reader, stalled := c.nodes[0], c.nodes[1]
	if first == addrs[0] {
		reader, stalled = c.nodes[1], c.nodes[0]
	}
	if stalled == c.nodes[0] {
		staller.Store(0)
	} else {
		staller.Store(1)
	}
	start := time.Now()
	if err := c.pull(reader); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the pull took %s behind a peer stalling on the manifest", took)
	}
	if !reader.src.isAside(stalled.addr) {
		t.Fatal("the stalling peer was not set aside")
	}
}

// A peer that takes a request and sends nothing (no answer, not even a 102
// Processing) is slow, not bad: a peer short of CPU looks so. Its request is left after
// stallAfter (counted from the request: it held it 60 s, the transport's header timeout)
// and asked again, for up to busyWait; then it is set aside as busy and the next is
// asked.
func TestAPeerThatNeverAnswers(t *testing.T) {
	for _, kind := range []string{"manifests", "blobs"} {
		t.Run(kind, func(t *testing.T) {
			oldStall, oldBusy := stallAfter, busyWait
			stallAfter, busyWait = 200*time.Millisecond, time.Second
			t.Cleanup(func() { stallAfter, busyWait = oldStall, oldBusy })
			reg := newRegistry(t, 2, 64<<10)
			silent := -1
			var asked atomic.Int64
			hang := func(i int, h http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if i != silent || !strings.Contains(r.URL.Path, "/"+kind+"/") {
						h.ServeHTTP(w, r)
						return
					}
					asked.Add(1)
					select { // takes the request, sends nothing (for long enough to tell)
					case <-r.Context().Done():
					case <-time.After(5 * time.Second):
					}
				})
			}
			c := newClusterOpts(t, reg, 2, clusterOpts{wrapServer: hang})
			d := digest.FromBytes(reg.manifest)
			if kind == "blobs" {
				for d = range reg.blobs {
					break
				}
			}
			head, reader := c.headAndOther(d)
			if head == c.nodes[0] {
				silent = 0
			} else {
				silent = 1
			}
			start := time.Now()
			if err := c.pull(reader); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took < busyWait || took > busyWait+3*time.Second {
				t.Errorf("the pull took %s behind a peer that never answers, want about busyWait (%s)", took, busyWait)
			}
			if n := asked.Load(); n < 3 {
				t.Errorf("the peer that never answers was asked %d times, want it asked again while busyWait lasts", n)
			}
			if !reader.src.isAside(head.addr) {
				t.Fatal("the peer that never answers was not set aside after busyWait")
			}
		})
	}
}

// A peer that works on its answer longer than stallAfter (it waits on its own
// sources: its parent, a busy peer, the registry) says so (102 Processing every
// progressEvery): it is waited for, not left, and sends the blob.
func TestAPeerWorkingOnItsAnswerIsWaitedFor(t *testing.T) {
	old := stallAfter
	stallAfter = 400 * time.Millisecond
	t.Cleanup(func() { stallAfter = old })
	reg := newRegistry(t, 2, 64<<10)
	slow := -1
	wait := func(i int, h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if i == slow && strings.Contains(r.URL.Path, "/blobs/") {
				time.Sleep(3 * stallAfter)
			}
			h.ServeHTTP(w, r)
		})
	}
	c := newClusterWith(t, reg, 2, wait)
	var d digest.Digest
	for d = range reg.blobs {
		break
	}
	head, reader := c.headAndOther(d)
	if head == c.nodes[0] {
		slow = 0
	} else {
		slow = 1
	}
	md := digest.FromBytes(reg.manifest)
	readWhole(t, reader, reg, md, d)
	if reader.src.isAside(head.addr) {
		t.Fatal("a peer working on its answer was set aside")
	}
	if reader.stats.FromPeers.Load() != int64(len(reg.blobs[d])) {
		t.Fatalf("%d bytes from the peer, want the blob's %d", reader.stats.FromPeers.Load(), len(reg.blobs[d]))
	}
}

// Two nodes never wait on each other: with the registry gone and no node holding the
// manifest, the node heading it asks its peer, whose hop back is answered from the
// registry alone (a 404 at once), not joined to the first node's own fetch (which
// waits on the peer: the two waited 60 s on each other).
func TestAHopNeverWaitsOnAFetchThatAsksPeers(t *testing.T) {
	reg := newRegistry(t, 2, 64<<10)
	reg.down.Store(true)
	c := newCluster(t, reg, 2)
	md := digest.FromBytes(reg.manifest)
	head := c.nodes[0]
	if Order(md, []string{c.nodes[0].addr, c.nodes[1].addr})[0] == c.nodes[1].addr {
		head = c.nodes[1]
	}
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.pull(head) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a manifest no node and no registry has was served")
		}
		t.Logf("failed in %s, as it should: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(5 * time.Second):
		t.Fatal("the two nodes wait on each other")
	}
	for _, nd := range c.nodes {
		for _, other := range c.nodes {
			if nd != other && nd.src.isAside(other.addr) {
				t.Errorf("%s set %s aside for a 404", nd.addr, other.addr)
			}
		}
	}
}

// A peer asked for a layer as a manifest (a hop, say) answers 404, and is not set
// aside: it used to serve the layer cut at 4 MiB under the layer's digest, and the
// asking node took a healthy peer for one sending wrong bytes for 10 minutes.
func TestALayerAskedAsAManifestIsNotThere(t *testing.T) {
	reg := newRegistry(t, 1, 5<<20)
	c := newCluster(t, reg, 2)
	holder, asker := c.nodes[1], c.nodes[0]
	if err := c.pull(holder); err != nil {
		t.Fatal(err)
	}
	md := digest.FromBytes(reg.manifest)
	var layer digest.Digest
	for d, b := range reg.blobs {
		if len(b) > 4<<20 {
			layer = d
		}
	}
	if layer == "" {
		t.Fatal("no layer over 4 MiB")
	}
	if _, _, err := asker.src.Manifest(context.Background(), repo, []digest.Digest{md}, layer, -1); err == nil {
		t.Fatal("a layer was taken for a manifest")
	}
	if asker.src.isAside(holder.addr) {
		t.Fatal("a healthy peer was set aside for not serving a layer as a manifest")
	}
}

// busyPeers makes every request time out waiting for a slot at once, and asks again
// at once: a test's busy window is short.
func busyPeers(t *testing.T) {
	oldSlot, oldBusy, oldPoll := slotWait, busyWait, pinPoll
	slotWait, busyWait, pinPoll = 20*time.Millisecond, 400*time.Millisecond, 50*time.Millisecond
	t.Cleanup(func() { slotWait, busyWait, pinPoll = oldSlot, oldBusy, oldPoll })
}

// fillSlots takes every slot of nd's server (blobs and manifests): it answers 503.
func fillSlots(nd *node) {
	for range cap(nd.server.slots) {
		nd.server.slots <- struct{}{}
	}
	for range cap(nd.server.manifestSlots) {
		nd.server.manifestSlots <- struct{}{}
	}
}

// headAndOther are the node heading d among c's two nodes, and the other.
func (c *cluster) headAndOther(d digest.Digest) (head, other *node) {
	if Order(d, []string{c.nodes[0].addr, c.nodes[1].addr})[0] == c.nodes[0].addr {
		return c.nodes[0], c.nodes[1]
	}
	return c.nodes[1], c.nodes[0]
}

// readWhole reads blob d of reg's image (manifest md) through nd's Source, and fails
// the test unless every byte of it came.
func readWhole(t *testing.T, nd *node, reg *fakeRegistry, md, d digest.Digest) {
	t.Helper()
	rc, _, err := nd.src.Blob(context.Background(), repo, []digest.Digest{md}, d, int64(len(reg.blobs[d])))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(b, reg.blobs[d]) {
		t.Fatalf("the blob: %d bytes, %v", len(b), err)
	}
}

// A peer answering 503 for ever costs one busy window (busyWait), then is set aside:
// not a window for every digest it heads. The busy peer is the one heading more of the
// image's digests (at least 7 of its 12), so it heads the manifest or blobs each time.
func TestAPeerBusyForEverIsSetAside(t *testing.T) {
	busyPeers(t)
	reg := newRegistry(t, 10, 64<<10)
	c := newCluster(t, reg, 2)
	addrs := []string{c.nodes[0].addr, c.nodes[1].addr}
	heads := [2]int{}
	for _, d := range append([]digest.Digest{digest.FromBytes(reg.manifest)}, slices.Collect(maps.Keys(reg.blobs))...) {
		if Order(d, addrs)[0] == addrs[1] {
			heads[1]++
		} else {
			heads[0]++
		}
	}
	busy, reader := c.nodes[1], c.nodes[0]
	if heads[0] > heads[1] {
		busy, reader = c.nodes[0], c.nodes[1]
	}
	fillSlots(busy)
	start := time.Now()
	if err := c.pull(reader); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("the busy peer heads %d of %d digests; the pull took %s", max(heads[0], heads[1]), heads[0]+heads[1], took)
	if !reader.src.isAside(busy.addr) {
		t.Fatal("a peer busy for a whole window was not set aside")
	}
	// Without the bound each digest it heads costs a whole window.
	if took > 3*busyWait {
		t.Fatalf("the pull took %s: a busy window for each digest the busy peer heads", took)
	}
}

// A peer answering 503 for ever to manifest requests is asked again for one busy
// window, then set aside, and the manifest comes from the next (the registry). Each
// time it is found busy again for a whole window without answering in between, it is
// set aside twice as long; once it answers, from failedFor again.
func TestAPeerBusyForEverIsSetAsideForAManifest(t *testing.T) {
	busyPeers(t)
	reg := newRegistry(t, 1, 16<<10)
	c := newCluster(t, reg, 2)
	md := digest.FromBytes(reg.manifest)
	busy, reader := c.headAndOther(md)
	fillSlots(busy)
	ask := func(round int, want time.Duration) {
		t.Helper()
		reader.src.mu.Lock()
		delete(reader.src.bad, busy.addr) // the last set-aside ended
		reader.src.mu.Unlock()
		start := time.Now()
		data, _, err := reader.src.Manifest(context.Background(), repo, nil, md, -1)
		if err != nil || !bytes.Equal(data, reg.manifest) {
			t.Fatalf("round %d: %d bytes, %v", round, len(data), err)
		}
		aside := reader.src.asideFor(busy.addr)
		t.Logf("round %d: %s, then the peer set aside for %s", round, time.Since(start).Round(time.Millisecond), aside.Round(time.Second))
		if aside > want || aside < want-5*time.Second {
			t.Fatalf("round %d: the busy peer is set aside for %s, want %s", round, aside, want)
		}
	}
	ask(1, failedFor)
	ask(2, 2*failedFor)
	ask(3, 4*failedFor)
	// It answers (a slot free), then is busy again: failedFor again.
	<-busy.server.manifestSlots
	reader.src.mu.Lock()
	delete(reader.src.bad, busy.addr)
	reader.src.mu.Unlock()
	if _, _, err := reader.src.Manifest(context.Background(), repo, nil, md, -1); err != nil {
		t.Fatal(err)
	}
	busy.server.manifestSlots <- struct{}{}
	ask(4, failedFor)
}

// A peer answering 503 for ever to blob requests (every ancestor of the blob in its
// tree busy) is asked again for one busy window, then set aside, and the blob comes
// from the registry.
func TestAPeerBusyForEverIsSetAsideForABlob(t *testing.T) {
	busyPeers(t)
	reg := newRegistry(t, 1, 64<<10)
	c := newCluster(t, reg, 2)
	md := digest.FromBytes(reg.manifest)
	var d digest.Digest
	for d = range reg.blobs {
		break
	}
	busy, reader := c.headAndOther(d)
	fillSlots(busy)
	type result struct {
		data []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		rc, _, err := reader.src.Blob(context.Background(), repo, []digest.Digest{md}, d, int64(len(reg.blobs[d])))
		if err != nil {
			done <- result{nil, err}
			return
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		done <- result{b, err}
	}()
	select {
	case r := <-done:
		if r.err != nil || !bytes.Equal(r.data, reg.blobs[d]) {
			t.Fatalf("the blob: %d bytes, %v", len(r.data), r.err)
		}
	case <-time.After(10 * busyWait):
		t.Fatal("the blob still waits on a peer busy for ever")
	}
	if !reader.src.isAside(busy.addr) {
		t.Fatal("a peer busy for a whole window was not set aside")
	}
}

// One busy episode seen by many fetches at once (a pre-load asks for every blob the
// busy peer heads) sets the peer aside once, for failedFor (the first time), with one
// line logged: not once per fetch, each doubling the last (up to busyAsideMax at once).
func TestOneBusyEpisodeSeenByManyFetchesSetsAsideOnce(t *testing.T) {
	busyPeers(t)
	reg := newRegistry(t, 12, 16<<10)
	c := newCluster(t, reg, 2)
	md := digest.FromBytes(reg.manifest)
	heads := func(busy *node) (ds []digest.Digest) {
		for d := range reg.blobs {
			if h, _ := c.headAndOther(d); h == busy {
				ds = append(ds, d)
			}
		}
		return ds
	}
	busy, reader := c.nodes[0], c.nodes[1]
	ds := heads(busy)
	if len(ds) < 3 {
		busy, reader = reader, busy
		ds = heads(busy)
	}
	if len(ds) < 3 {
		t.Fatalf("the busy peer heads %d blobs, want 3 or more", len(ds))
	}
	var warned atomic.Int32
	log := logrus.New()
	log.SetOutput(io.Discard)
	log.AddHook(countWarns{&warned})
	reader.src.Log = log
	fillSlots(busy)
	var wg sync.WaitGroup
	for _, d := range ds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rc, _, err := reader.src.Blob(context.Background(), repo, []digest.Digest{md}, d, int64(len(reg.blobs[d])))
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, rc)
			rc.Close()
		}()
	}
	wg.Wait()
	aside := reader.src.asideFor(busy.addr)
	t.Logf("%d blobs fetched at once behind one busy peer: set aside for %s, %d lines logged", len(ds), aside.Round(time.Second), warned.Load())
	if aside > failedFor+time.Second {
		t.Fatalf("one busy episode set the peer aside for %s, want %s", aside.Round(time.Second), failedFor)
	}
	if warned.Load() != 1 {
		t.Fatalf("one busy episode logged %d set-asides, want 1", warned.Load())
	}
}

// countWarns counts the set-asides logged.
type countWarns struct{ n *atomic.Int32 }

func (countWarns) Levels() []logrus.Level { return []logrus.Level{logrus.WarnLevel} }
func (h countWarns) Fire(e *logrus.Entry) error {
	if strings.Contains(e.Message, "setting a peer aside") {
		h.n.Add(1)
	}
	return nil
}

// A peer set aside for long (it sent wrong bytes) stays aside that long when one of its
// requests then fails (a shorter set-aside): the longer holds.
func TestALaterShortSetAsideDoesNotShortenALongOne(t *testing.T) {
	s := NewSource("", func() []string { return nil }, nil, http.DefaultClient, &Stats{}, logrus.New())
	s.setAside("peer.example:1", corruptFor, errors.New("wrong bytes"))
	s.setAside("peer.example:1", failedFor, errors.New("cut"))
	if aside := s.asideFor("peer.example:1"); aside < corruptFor-time.Second {
		t.Fatalf("set aside for %s after a set-aside for %s, then one for %s", aside.Round(time.Second), corruptFor, failedFor)
	}
	s.setAside("peer.example:2", failedFor, errors.New("cut"))
	s.setAside("peer.example:2", corruptFor, errors.New("wrong bytes"))
	if aside := s.asideFor("peer.example:2"); aside < corruptFor-time.Second {
		t.Fatalf("set aside for %s after a set-aside for %s, then one for %s", aside.Round(time.Second), failedFor, corruptFor)
	}
}
