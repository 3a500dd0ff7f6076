package peers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/mirror"
	"github.com/imagepin/imagepin/pin"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/testcerts"
)

// steps records the effects of a pin write in the order they happen.
type steps struct {
	mu  sync.Mutex
	got []string
}

func (s *steps) add(x string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, x)
}

func (s *steps) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.got
	s.got = nil
	return out
}

// runtimePinner is a runtime's pinner that records its writes.
type runtimePinner struct {
	steps   *steps
	err     error
	changed bool
}

func (*runtimePinner) Describe() string { return "test pins" }
func (*runtimePinner) Held() []string   { return nil }
func (p *runtimePinner) Write(_ context.Context, patterns []string, _ func(string) (bool, bool)) (pin.Written, error) {
	if p.err != nil {
		p.steps.add("pins failed")
		return pin.Written{}, p.err
	}
	p.steps.add("pins " + strings.Join(patterns, ","))
	return pin.Written{Changed: p.changed}, nil
}
func (*runtimePinner) Apply(context.Context) error                      { return nil }
func (*runtimePinner) InEffect(context.Context, []string) (bool, error) { return true, nil }
func (*runtimePinner) Pulled(context.Context, string) (bool, error)     { return false, nil }
func (*runtimePinner) Support(string) (pin.Support, error)              { return pin.Support{}, nil }

// recordPinner pins image records and follows the runtime's events, as containerd's.
type recordPinner struct{ runtimePinner }

func (*recordPinner) PinsRecords() bool                   { return true }
func (*recordPinner) Watch(context.Context, func()) error { return nil }

// files records each render, with what the mirror served at that moment.
type files struct {
	steps   *steps
	node    *Node
	ref     string
	changed bool
	err     error
}

func (f *files) Render(patterns []string) (bool, error) {
	repo, d, _ := strings.Cut(f.ref, "@")
	f.steps.add(fmt.Sprintf("files %s (mirror serves it: %v)", strings.Join(patterns, ","), f.node.isPinned(repo, digest.Digest(d))))
	return f.changed, f.err
}

func newNode(t *testing.T, cfg Config) *Node {
	t.Helper()
	store, err := blobstore.Open(filepath.Join(t.TempDir(), "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	return New(cfg, store, logrus.New())
}

// A pin write: the runtime's pins, then the mirror told what it may serve, then the
// runtime's files pointing at the mirror (so the runtime never asks the mirror for a
// pinned image it does not serve yet). A failed pin write tells and renders nothing; a
// failed render is a fault that keeps the pins' result.
func TestPinnerTellsTheMirrorBetweenThePinsAndTheFiles(t *testing.T) {
	n := newNode(t, Config{})
	ref := repo + "@sha256:" + strings.Repeat("1", 64)
	s := &steps{}
	rt := &runtimePinner{steps: s}
	f := &files{steps: s, node: n, ref: ref, changed: true}
	p := n.Pinner(rt, f)
	ctx := context.Background()

	w, err := p.Write(ctx, []string{ref, "quay.io/ns/*"}, nil)
	if err != nil || !w.Changed || len(w.Faults) != 0 {
		t.Fatalf("write: %+v %v", w, err)
	}
	if got, want := s.take(), []string{"pins " + ref + ",quay.io/ns/*", "files " + ref + ",quay.io/ns/* (mirror serves it: true)"}; !slices.Equal(got, want) {
		t.Fatalf("effects %q, want %q", got, want)
	}

	rt.err = errors.New("drop-in: read-only file system")
	if _, err := p.Write(ctx, nil, nil); !errors.Is(err, rt.err) {
		t.Fatalf("a failed pin write: %v", err)
	}
	if got := s.take(); !slices.Equal(got, []string{"pins failed"}) {
		t.Fatalf("effects of a failed pin write %q", got)
	}
	if !n.isPinned(repo, digest.Digest(strings.TrimPrefix(ref, repo+"@"))) {
		t.Fatal("a failed pin write took the mirror's pins away")
	}

	rt.err, rt.changed, f.changed, f.err = nil, true, false, errors.New("node-local mirror's hosts.toml: broken")
	w, err = p.Write(ctx, nil, nil)
	if err != nil || !w.Changed || !slices.Equal(w.Faults, []string{f.err.Error()}) {
		t.Fatalf("a failed render: %+v %v", w, err)
	}
	if got := s.take(); !slices.Equal(got, []string{"pins ", "files  (mirror serves it: false)"}) {
		t.Fatalf("effects of the unpin %q", got)
	}
}

// The agent finds the runtime's capabilities on the pinner by type assertion: the
// mirror's decorator hides none and invents none.
func TestPinnerKeepsTheRuntimesCapabilities(t *testing.T) {
	n := newNode(t, Config{})
	s := &steps{}
	f := &files{steps: s, node: n}
	p := n.Pinner(&recordPinner{runtimePinner{steps: s}}, f)
	if _, ok := p.(pin.Watcher); !ok {
		t.Error("a Watcher behind the mirror is no longer one")
	}
	if !pin.PinsRecords(p) {
		t.Error("a RecordPinner behind the mirror is no longer one")
	}
	if p.Describe() != "test pins" {
		t.Errorf("Describe %q", p.Describe())
	}
	p = n.Pinner(&runtimePinner{steps: s}, f)
	if _, ok := p.(pin.Watcher); ok {
		t.Error("the decorator made up a Watcher")
	}
	if pin.PinsRecords(p) {
		t.Error("the decorator made up a RecordPinner")
	}
}

// The prune runs only when the pinned references change, not at every write.
func TestPruneWakesOnlyWhenThePinsChange(t *testing.T) {
	n := newNode(t, Config{})
	woke := func() bool {
		select {
		case <-n.prune:
			return true
		default:
			return false
		}
	}
	a, b := repo+"@sha256:"+strings.Repeat("a", 64), repo+"@sha256:"+strings.Repeat("b", 64)
	for i, c := range []struct {
		refs []string
		want bool
	}{
		{[]string{a}, true},
		{[]string{a}, false},
		{[]string{a, "quay.io/*"}, false}, // a pattern names no manifest
		{[]string{b}, true},
		{[]string{a, b}, true},
		{nil, true},
		{nil, false},
	} {
		n.setPinned(c.refs)
		if got := woke(); got != c.want {
			t.Errorf("%d %v: prune woken %v, want %v", i, c.refs, got, c.want)
		}
	}
}

// The peers are the static list and the aggregator's, each once; a node sharing
// nothing (or none at all) ignores the aggregator.
func TestPeersFromConfigAndAggregator(t *testing.T) {
	var none *Node
	none.FromAggregator([]string{"10.0.0.9:7444"})
	alone := newNode(t, Config{Nodes: []string{"10.0.0.1:7444"}})
	alone.FromAggregator([]string{"10.0.0.9:7444"})
	if got := alone.nodes(); !slices.Equal(got, []string{"10.0.0.1:7444"}) {
		t.Fatalf("a node sharing nothing took the aggregator's peers: %v", got)
	}
	static := []string{"10.0.0.1:7444", "10.0.0.2:7444"}
	n := newNode(t, Config{Address: "10.0.0.1:7444", Nodes: static})
	n.server = &Server{} // as sharing leaves it
	static[1] = "changed by the caller"
	n.FromAggregator([]string{"10.0.0.2:7444", "10.0.0.3:7444"})
	if got, want := n.nodes(), []string{"10.0.0.1:7444", "10.0.0.2:7444", "10.0.0.3:7444"}; !slices.Equal(got, want) {
		t.Fatalf("peers %v, want %v", got, want)
	}
	n.FromAggregator(nil)
	if got, want := n.nodes(), []string{"10.0.0.1:7444", "10.0.0.2:7444"}; !slices.Equal(got, want) {
		t.Fatalf("peers after the aggregator gave none %v, want %v", got, want)
	}
}

// A peer the aggregator names for the first time is told (the agent then tries its
// failed pulls again at once: a joining node with the registry gone has no other
// source); the same peers again, or fewer, are not.
func TestNewPeersFromTheAggregatorAreTold(t *testing.T) {
	n := newNode(t, Config{Address: "10.0.0.1:7444"})
	n.server = &Server{} // as sharing leaves it
	told := 0
	n.OnPeers(func() { told++ })
	for i, c := range []struct {
		peers []string
		want  int
	}{
		{nil, 0},
		{[]string{"10.0.0.2:7444"}, 1},
		{[]string{"10.0.0.2:7444"}, 1},
		{[]string{"10.0.0.2:7444", "10.0.0.3:7444"}, 2},
		{[]string{"10.0.0.3:7444"}, 2},
		{[]string{"10.0.0.2:7444", "10.0.0.3:7444"}, 3},
	} {
		n.FromAggregator(c.peers)
		if told != c.want {
			t.Fatalf("%d %v: told %d times, want %d", i, c.peers, told, c.want)
		}
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Two nodes as imagepind runs them, from their Config: node-0 pins the image and pulls
// it from the registry through its loopback mirror; node-1 knows node-0 only from the
// aggregator and, with the registry gone, gets it from node-0 over HTTPS. Stamp carries
// the counts; an unpin empties node-0's store; what is not pinned is a 404.
func TestNodesServeShareAndPrune(t *testing.T) {
	reg := newRegistry(t, 3, 64<<10)
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "nodes-ca")
	if err != nil {
		t.Fatal(err)
	}
	md := digest.FromBytes(reg.manifest)
	ref := repo + "@" + md.String()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	var nodes []*Node
	var pinners []pin.Pinner
	var peerAddrs []string
	for i := range 2 {
		name := fmt.Sprintf("node-%d", i)
		serving, err := ca.NodeServing(dir, name, net.ParseIP("127.0.0.1"))
		if err != nil {
			t.Fatal(err)
		}
		client, err := ca.Node(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		addr := freeAddr(t)
		peerAddrs = append(peerAddrs, addr)
		n := newNode(t, Config{MirrorAddress: freeAddr(t), Address: addr, Nodes: []string{addr},
			Cert: serving, ClientCA: ca.File, ClientCert: client, CA: ca.File, MaxServing: 4})
		n.Bind(Runtime{Registry: reg})
		if n.server == nil {
			t.Fatalf("%s shares nothing", name)
		}
		s := &steps{}
		p := n.Pinner(&runtimePinner{steps: s}, &files{steps: s, node: n, ref: ref})
		if _, err := p.Write(ctx, []string{ref}, nil); err != nil {
			t.Fatal(err)
		}
		for _, run := range []func(context.Context) error{n.Run, n.Serve, n.ServePeers} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := run(ctx); err != nil {
					t.Errorf("%s: %v", name, err)
				}
			}()
		}
		nodes, pinners = append(nodes, n), append(pinners, p)
	}
	nodes[1].FromAggregator(peerAddrs)

	get := func(n *Node, kind string, d digest.Digest) (int, error) {
		url := "http://" + n.cfg.MirrorAddress + "/v2/" + mirror.PathFor(repo) + "/" + kind + "/" + d.String()
		var resp *http.Response
		var err error
		for range 100 { // the listener starting
			if resp, err = http.Get(url); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return 0, err
		}
		if resp.StatusCode == http.StatusOK && digest.FromBytes(b) != d {
			return 0, fmt.Errorf("%s %s: wrong bytes", kind, d)
		}
		return resp.StatusCode, nil
	}
	pull := func(n *Node) {
		t.Helper()
		if code, err := get(n, "manifests", md); err != nil || code != http.StatusOK {
			t.Fatalf("manifest: %d %v", code, err)
		}
		for d := range reg.blobs {
			if code, err := get(n, "blobs", d); err != nil || code != http.StatusOK {
				t.Fatalf("blob %s: %d %v", d, code, err)
			}
		}
	}
	pull(nodes[0])
	if code, _ := get(nodes[0], "manifests", digest.FromString("not pinned")); code != http.StatusNotFound {
		t.Fatalf("a manifest not pinned: %d", code)
	}
	reg.down.Store(true)
	pull(nodes[1])

	var st [2]status.Node
	for i, n := range nodes {
		n.Stamp(func(s status.Node) { st[i] = s })(status.Node{})
	}
	p0, p1 := st[0].Node.Peers, st[1].Node.Peers
	if p0 == nil || p1 == nil || p0.Address != peerAddrs[0] || p0.FromRegistry == 0 || p0.ToPeers == 0 || p0.Stored == 0 ||
		p1.FromPeers == 0 || p1.FromRegistry != 0 {
		t.Fatalf("stamped %+v, %+v", p0, p1)
	}

	if _, err := pinners[0].Write(ctx, nil, nil); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		used, err := nodes[0].store.Usage(ctx)
		if err == nil && used == 0 {
			break
		}
		if i == 200 {
			t.Fatalf("the store keeps %d bytes after the unpin (%v)", used, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, _ := get(nodes[0], "manifests", md); code != http.StatusNotFound {
		t.Fatalf("an unpinned manifest: %d", code)
	}
}

// heldContent is containerd's content store after its pull: it holds every blob (the
// mirror still fills its own store first, as it reads its store before it).
type heldContent struct{}

func (heldContent) Reader(context.Context, digest.Digest) (io.ReadSeekCloser, int64, error) {
	return nil, 0, errdefs.ErrNotFound
}
func (heldContent) Has(context.Context, digest.Digest) (bool, error) { return true, nil }

// On containerd the mirror's store holds a blob only until containerd does: pruned once
// the fills settle, with the pins unchanged.
func TestANodeOnTheRuntimesContentStoreKeepsNoSecondCopy(t *testing.T) {
	old := settleAfterFill
	settleAfterFill = 10 * time.Millisecond
	t.Cleanup(func() { settleAfterFill = old })
	reg := newRegistry(t, 2, 16<<10)
	md := digest.FromBytes(reg.manifest)
	n := newNode(t, Config{MirrorAddress: freeAddr(t)})
	n.Bind(Runtime{Registry: reg, Content: heldContent{}})
	n.setPinned([]string{repo + "@" + md.String()})
	<-n.prune // the pins changed before Run: that prune is not the one checked
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	local := httptest.NewServer(n.local)
	t.Cleanup(local.Close)
	paths := []string{"manifests/" + md.String()}
	for d := range reg.blobs {
		paths = append(paths, "blobs/"+d.String())
	}
	for _, p := range paths {
		resp, err := http.Get(local.URL + "/v2/" + mirror.PathFor(repo) + "/" + p)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", p, resp.StatusCode)
		}
	}
	for i := 0; ; i++ {
		if used, err := n.store.Usage(ctx); err == nil && used == 0 {
			break
		} else if i == 200 {
			t.Fatalf("the store keeps %d bytes the runtime holds (%v)", used, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// corruptContent is containerd's content store holding a copy of one digest that does
// not match it (corrupted on disk), and nothing else.
type corruptContent struct {
	d    digest.Digest
	data []byte
}

func (c corruptContent) Reader(_ context.Context, d digest.Digest) (io.ReadSeekCloser, int64, error) {
	if d != c.d {
		return nil, 0, errdefs.ErrNotFound
	}
	return readSeekNopCloser{bytes.NewReader(c.data)}, int64(len(c.data)), nil
}
func (c corruptContent) Has(_ context.Context, d digest.Digest) (bool, error) { return d == c.d, nil }

type readSeekNopCloser struct{ *bytes.Reader }

func (readSeekNopCloser) Close() error { return nil }

// A copy in containerd's content store found corrupted is served from the registry
// instead, and the node's status says so, with the command that removes it.
func TestStampSaysTheRuntimesCopyIsCorrupted(t *testing.T) {
	reg := newRegistry(t, 1, 16<<10)
	md := digest.FromBytes(reg.manifest)
	bad := bytes.Clone(reg.manifest)
	bad[len(bad)/2] ^= 1
	n := newNode(t, Config{})
	n.Bind(Runtime{Registry: reg, Content: corruptContent{md, bad}})
	n.setPinned([]string{repo + "@" + md.String()})
	local := httptest.NewServer(n.local)
	t.Cleanup(local.Close)
	resp, err := http.Get(local.URL + "/v2/" + mirror.PathFor(repo) + "/manifests/" + md.String())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Equal(b, reg.manifest) {
		t.Fatalf("the manifest: %d, %d bytes", resp.StatusCode, len(b))
	}
	var st status.Node
	n.Stamp(func(s status.Node) { st = s })(status.Node{})
	if len(st.Faults) != 1 || !strings.Contains(st.Faults[0], md.String()) || !strings.Contains(st.Faults[0], "content rm") {
		t.Fatalf("faults %q, want one naming %s and how to remove it", st.Faults, md)
	}
}
