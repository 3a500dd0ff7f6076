//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/peers"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
	"github.com/imagepin/imagepin/test/testcerts"
)

// peerCluster is several nodes on this machine, each its own CRI-O and imagepind, sharing
// one registry reached through a link that counts what crosses it.
type peerCluster struct {
	t     *testing.T
	reg   *env.Registry
	link  *env.Proxy
	ca    *testcerts.CA
	nodes []*world
	opts  []worldOptions // each node's imagepind config
	addrs []string       // the peers' addresses, 127.0.0.(2+i)
	peerClusterOptions
}

// aggregatorCerts is where nodes report: the aggregator and its CAs.
type aggregatorCerts struct {
	proc      *aggregatorProc
	kubeletCA *testcerts.CA
	serverCA  *testcerts.CA
}

// peerClusterOptions: with agg, the nodes report to that aggregator (their client
// certificates from its kubelet CA) and get their peers from it (no static list); with
// containerd, they run containerd instead of CRI-O.
type peerClusterOptions struct {
	agg        *aggregatorCerts
	containerd bool
}

// newPeerCluster is n nodes (configured, not started) behind a counting link to one
// registry (no bandwidth limit or latency: the e2e tests count, the bench times).
func newPeerCluster(t *testing.T, n int, o peerClusterOptions) *peerCluster {
	t.Helper()
	dir := t.TempDir()
	reg := startRegistry(t, dir)
	link, err := env.StartLink(reg.Host, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(link.Close)
	ca, err := testcerts.NewCA(dir, "nodes-ca")
	if err != nil {
		t.Fatal(err)
	}
	c := &peerCluster{t: t, reg: reg, link: link, ca: ca, peerClusterOptions: o}
	port, err := env.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		c.addrs = append(c.addrs, fmt.Sprintf("127.0.0.%d:%d", 2+i, port))
	}
	for i := range n {
		w, o := c.node(i)
		c.nodes, c.opts = append(c.nodes, w), append(c.opts, o)
	}
	return c
}

// node configures node i (its CRI-O and imagepind's config), starting nothing.
func (c *peerCluster) node(i int) (*world, worldOptions) {
	t := c.t
	dir := t.TempDir()
	w := worldOn(t, dir, c.reg, c.link.Addr)
	if c.containerd {
		ctr, err := env.NewContainerd(filepath.Join(dir, "containerd"), env.ContainerdOptions{Insecure: []string{c.link.Addr}})
		if err != nil {
			t.Fatal(err)
		}
		w.ctr = ctr
	}
	name := fmt.Sprintf("node-%d", i)
	w.nodeName = name
	serving, err := c.ca.NodeServing(dir, name, net.ParseIP(fmt.Sprintf("127.0.0.%d", 2+i)))
	if err != nil {
		t.Fatal(err)
	}
	clientCA := c.ca
	if c.agg != nil {
		clientCA = c.agg.kubeletCA
	}
	client, err := clientCA.Node(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	mport, err := env.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	nodes := `"` + strings.Join(c.addrs, `", "`) + `"`
	report := ""
	if c.agg != nil {
		nodes = "" // from the aggregator
		report = fmt.Sprintf("[report]\naggregator = %q\nheartbeat = \"1s\"\ncert = %q\nca = %q\n", c.agg.proc.grpcAddr, client, c.agg.serverCA.File)
	}
	return w, worldOptions{metrics: true, extra: report + fmt.Sprintf(`[peers]
enabled = true
mirror_address = "127.0.0.1:%d"
address = %q
nodes = [%s]
cert = %q
ca = %q
client_cert = %q
client_ca = %q
`, mport, c.addrs[i], nodes, serving, c.ca.File, client, clientCA.File)}
}

// start starts node i's CRI-O and imagepind.
func (c *peerCluster) start(i int) *world {
	w := c.nodes[i]
	if w.ctr != nil {
		w.run(w.ctr.Start, w.ctr.Cleanup)
	} else {
		w.run(w.crio.Start, w.crio.Cleanup)
	}
	w.writeConfig(c.opts[i])
	w.startDaemon()
	return w
}

// push pushes n images of one layer of size random bytes and returns their
// references through the link.
func (c *peerCluster) push(prefix string, n int, size int64) (refs []string, total int64) {
	c.t.Helper()
	for i := range n {
		img, err := c.reg.PushRandom(context.Background(), fmt.Sprintf("%s-%d", prefix, i), 1, size)
		if err != nil {
			c.t.Fatal(err)
		}
		refs = append(refs, strings.Replace(img.Ref(), c.reg.Host, c.link.Addr, 1))
		total += img.Size
	}
	return refs, total
}

func peerBytes(w *world) status.PeerBytes {
	if p := w.readStatus().Node.Peers; p != nil {
		return *p
	}
	return status.PeerBytes{}
}

// Three CRI-O nodes pin one set: every node Ready, the images pinned under their own
// names, and the registry sent each blob once for the whole peerCluster. Then the registry
// goes; a fourth node joins, one peer killed (-9) and another's store corrupted on
// disk, and still becomes Ready with every image right, from the peer left.
func TestPeersShareOneDownloadAndALateNodeJoins(t *testing.T) {
	c := newPeerCluster(t, 4, peerClusterOptions{})
	refs, total := c.push("shared", 4, 1<<20)
	first := []*world{c.start(0), c.start(1), c.start(2)}
	for _, w := range first {
		w.writeSet("shared.yaml", alphaSet("shared", refs...))
	}
	start := time.Now()
	for i, w := range first {
		w.waitFor(fmt.Sprintf("node-%d Ready", i), 120*time.Second, phaseIs("shared", status.Ready))
		w.requirePinned(refs...)
	}
	took := time.Since(start)
	down := c.link.Down.Load()
	t.Logf("3 nodes Ready in %s; the set is %d bytes compressed; the registry sent %d bytes (%.3f× the set; without peers it would be 3×)",
		took.Round(time.Millisecond), total, down, float64(down)/float64(total))
	var fromPeers, toPeers int64
	for i, w := range first {
		p := peerBytes(w)
		t.Logf("node-%d: %+v", i, p)
		fromPeers += p.FromPeers
		toPeers += p.ToPeers
		if p.Stored < total {
			t.Errorf("node-%d stores %d bytes, the set's blobs are %d", i, p.Stored, total)
		}
	}
	if float64(down) > 1.05*float64(total) {
		t.Fatalf("the registry sent %d bytes for a set of %d: %.2f×, want ≤ 1.05×", down, total, float64(down)/float64(total))
	}
	if fromPeers < total {
		t.Fatalf("the nodes read %d bytes from each other; two of three should have read most of the set (%d)", fromPeers, total)
	}
	// Each node's CRI-O went to its own mirror first.
	for i, w := range first {
		if !w.crio.LogContains(`Trying to access \"127.0.0.1:`) {
			t.Fatalf("node-%d: CRI-O never tried the node-local mirror:\n%s", i, w.crio.LogTail(20))
		}
	}

	// The registry gone; one peer killed (-9); every layer another stores corrupted on
	// disk (its manifests and configs left right, so the late node takes its layers and
	// finds out only at their last byte). Which ones: those the late node will ask (the
	// rendezvous order decides), so both faults are met, and the third peer has it all.
	c.reg.Stop()
	files, _ := filepath.Glob(filepath.Join(first[0].dir, "state", "blobs", "blobs", "sha256", "*"))
	var digests []digest.Digest
	layers := map[digest.Digest]bool{}
	for _, f := range files {
		d := digest.NewDigestFromEncoded(digest.SHA256, filepath.Base(f))
		digests = append(digests, d)
		if st, err := os.Stat(f); err == nil && st.Size() >= 64<<10 {
			layers[d] = true
		}
	}
	// asked is how many of ds the late node asks node i for first, among the live ones.
	asked := func(ds []digest.Digest, live []int) map[int]int {
		n := map[int]int{}
		for _, d := range ds {
			for _, a := range peers.Order(d, c.addrs) {
				if i := slices.Index(c.addrs, a); slices.Contains(live, i) {
					n[i]++
					break
				}
			}
		}
		return n
	}
	first3 := asked(digests, []int{0, 1, 2})
	dead := 0
	for i, n := range first3 {
		if n > first3[dead] {
			dead = i
		}
	}
	var live []int
	for _, i := range []int{0, 1, 2} {
		if i != dead {
			live = append(live, i)
		}
	}
	var layerDigests []digest.Digest
	for d := range layers {
		layerDigests = append(layerDigests, d)
	}
	served := asked(layerDigests, live)
	corrupt := live[0]
	if served[live[1]] > served[live[0]] {
		corrupt = live[1]
	}
	first[dead].daemon.Process.Kill()
	for d := range layers {
		f := filepath.Join(first[corrupt].dir, "state", "blobs", "blobs", "sha256", d.Encoded())
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		data[len(data)/2] ^= 0xff
		if err := os.WriteFile(f, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("registry stopped; node-%d's imagepind killed (the late node asks it first for %d of %d digests); the %d layers corrupted in node-%d's store (asked first for %d)",
		dead, first3[dead], len(digests), len(layers), corrupt, served[corrupt])
	late := c.start(3)
	late.writeSet("shared.yaml", alphaSet("shared", refs...))
	start = time.Now()
	late.waitFor("the late node Ready", 180*time.Second, phaseIs("shared", status.Ready))
	late.requirePinned(refs...)
	p := peerBytes(late)
	t.Logf("the late node Ready in %s with the registry gone: %+v", time.Since(start).Round(time.Millisecond), p)
	if p.FromRegistry != 0 || p.FromPeers < total {
		t.Fatalf("the late node: %d bytes from the registry, %d from peers (the set is %d)", p.FromRegistry, p.FromPeers, total)
	}
	// CRI-O checked every blob against its digest; the images run from what it stored.
	crictl := filepath.Join(env.CacheDir(), "crictl")
	for _, r := range refs {
		out, err := exec.Command(crictl, "--runtime-endpoint", "unix://"+late.socket(), "inspecti", r).CombinedOutput()
		if err != nil {
			t.Fatalf("crictl inspecti %s: %v %s", r, err, out)
		}
	}
	log, _ := os.ReadFile(filepath.Join(late.dir, "imagepind.log"))
	if !strings.Contains(string(log), "setting a peer aside") {
		t.Fatal("the late node never set aside the dead or the corrupt peer")
	}
	for _, want := range []string{c.addrs[dead], "do not match"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("the late node's log does not mention %q", want)
		}
	}
}

// Without a static list the peers come from the aggregator: the nodes that pin the same
// set. A second node that joins with the registry gone gets the set from the first.
// Neither node, each started with an empty mirror store, logs a prune warning.
func TestPeersFromTheAggregator(t *testing.T) {
	dir := t.TempDir()
	proc, kubeletCA, serverCA := startAggregator(t, dir)
	c := newPeerCluster(t, 2, peerClusterOptions{agg: &aggregatorCerts{proc: proc, kubeletCA: kubeletCA, serverCA: serverCA}})
	refs, total := c.push("agg-shared", 2, 512<<10)
	first := c.start(0)
	first.writeSet("shared.yaml", alphaSet("shared", refs...))
	first.waitFor("node-0 Ready", 60*time.Second, phaseIs("shared", status.Ready))
	c.reg.Stop()
	late := c.start(1)
	late.writeSet("shared.yaml", alphaSet("shared", refs...))
	late.waitFor("node-1 Ready from its peer", 90*time.Second, phaseIs("shared", status.Ready))
	late.requirePinned(refs...)
	p := peerBytes(late)
	t.Logf("node-1 Ready with the registry gone, its peer from the aggregator: %+v (the set: %d bytes of layers)", p, total)
	if p.FromPeers < total {
		t.Fatalf("node-1 read %d bytes from peers; the set's layers are %d", p.FromPeers, total)
	}
	log, _ := os.ReadFile(filepath.Join(late.dir, "imagepind.log"))
	if !strings.Contains(string(log), "[peers] peers from the aggregator") {
		t.Fatal("node-1 never logged its peers from the aggregator")
	}
	// Both nodes started with an empty store (the first pins prune it before any blob is
	// in it): normal, not a warning.
	for i, w := range []*world{first, late} {
		log, _ := os.ReadFile(filepath.Join(w.dir, "imagepind.log"))
		for _, line := range strings.Split(string(log), "\n") {
			if strings.Contains(line, "mirror store: prune") {
				t.Fatalf("node-%d, started with an empty store, warned: %s", i, line)
			}
		}
	}
	// The set's rollup: what the cluster fetched from the registry for it (node-0's
	// pulls; node-1 fetched nothing).
	waitUntil(t, "the aggregator's set view with the registry bytes", 20*time.Second, func() bool {
		v, ok := proc.set("shared")
		return ok && v.Ready && v.BytesFromRegistry >= total && float64(v.BytesFromRegistry) <= 1.05*float64(total)+64<<10
	})
	v, _ := proc.set("shared")
	t.Logf("the aggregator: set shared Ready on %d nodes, %d bytes fetched from registries for it (its layers: %d)", v.ReadyNodes, v.BytesFromRegistry, total)
}

// The same on containerd nodes: the mirror first in each registry's hosts.toml (the
// administrator's hosts kept after it), and a node that joins with the registry gone
// gets the set from its peer, served from that peer's containerd content store.
func TestPeersOnContainerd(t *testing.T) {
	c := newPeerCluster(t, 2, peerClusterOptions{containerd: true})
	refs, total := c.push("ctr-shared", 2, 512<<10)
	first := c.start(0)
	first.writeSet("shared.yaml", alphaSet("shared", refs...))
	first.waitFor("node-0 Ready", 60*time.Second, phaseIs("shared", status.Ready))
	for _, r := range refs {
		if !first.labelled(r) {
			t.Fatalf("%s is not pinned (labelled) on node-0", r)
		}
	}
	hosts, _ := filepath.Glob(filepath.Join(first.ctr.HostsDir, "*", "hosts.toml"))
	var found bool
	for _, h := range hosts {
		b, _ := os.ReadFile(h)
		if strings.Contains(string(b), "imagepin: the node-local mirror") && strings.Contains(string(b), `server = "http://`+c.link.Addr) {
			found = true
			if strings.Index(string(b), "127.0.0.1:") > strings.Index(string(b), `[host."http://`+c.link.Addr) {
				t.Fatalf("%s: the mirror's host is not first:\n%s", h, b)
			}
		}
	}
	if !found {
		t.Fatalf("no hosts.toml holds the mirror's block next to the administrator's server: %v", hosts)
	}
	// No second copy: once containerd holds the blobs, the mirror's store lets them go.
	store, err := blobstore.Open(filepath.Join(first.dir, "state", "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "node-0's mirror store to let go of what containerd holds", 30*time.Second, func() bool {
		used, _ := store.Usage(context.Background())
		return used == 0
	})
	c.reg.Stop()
	late := c.start(1)
	late.writeSet("shared.yaml", alphaSet("shared", refs...))
	late.waitFor("node-1 Ready from its peer", 90*time.Second, phaseIs("shared", status.Ready))
	for _, r := range refs {
		if !late.labelled(r) {
			t.Fatalf("%s is not pinned (labelled) on node-1", r)
		}
	}
	p := peerBytes(late)
	t.Logf("containerd node-1 Ready with the registry gone: %+v (the set: %d bytes of layers)", p, total)
	if p.FromPeers < total || p.FromRegistry != 0 {
		t.Fatalf("node-1: %d bytes from peers, %d from the registry; the set's layers are %d", p.FromPeers, p.FromRegistry, total)
	}
}
