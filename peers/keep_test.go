package peers

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/mirror"
	"github.com/imagepin/imagepin/test/testcerts"
)

// fastKeep makes the keeper start and retry within milliseconds.
func fastKeep(t *testing.T) {
	oldSettle, oldRetry := keepSettle, keepRetry
	keepSettle, keepRetry = 10*time.Millisecond, 50*time.Millisecond
	t.Cleanup(func() { keepSettle, keepRetry = oldSettle, oldRetry })
}

// run runs f until the test ends.
func run(t *testing.T, f func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

// waitHeld waits until n holds every blob of every image it pins, and returns what it
// holds.
func waitHeld(t *testing.T, n *Node, within time.Duration) []ImageHolding {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		hs := n.Holdings(context.Background())
		whole := len(hs) > 0
		for _, h := range hs {
			whole = whole && h.Err == nil && h.Complete && len(h.Missing()) == 0
		}
		if whole {
			return hs
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s the node holds %+v", within, hs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// CRI-O had every layer of the image when it was pinned (the kubelet pulled it), so no
// pull goes through the mirror: the node still puts every manifest and blob of it in
// its store, once the registry answers (it did not at first), asking it once per blob;
// what it holds says so; an unpin empties the store.
func TestANodeKeepsWhatItsRuntimeHadAlready(t *testing.T) {
	fastKeep(t)
	reg := newRegistry(t, 3, 64<<10)
	reg.down.Store(true)
	md := digest.FromBytes(reg.manifest)
	ref := repo + "@" + md.String()
	n := newNode(t, Config{})
	n.Bind(Runtime{Registry: reg})
	run(t, n.Run)
	n.setPinned([]string{ref})
	for i := 0; reg.attempts.Load() == 0; i++ {
		if i == 1000 {
			t.Fatal("the node asked nothing of the registry in 5 s after the pin")
		}
		time.Sleep(5 * time.Millisecond)
	}
	reg.down.Store(false)
	hs := waitHeld(t, n, 10*time.Second)
	if len(hs) != 1 || hs[0].Image != ref || len(hs[0].Blobs) != 1+len(reg.blobs) {
		t.Fatalf("holdings %+v; want %s with its manifest and %d blobs", hs, ref, len(reg.blobs))
	}
	for _, b := range hs[0].Blobs {
		if _, ok := n.store.Size(context.Background(), b.Digest); !ok {
			t.Fatalf("%s not in the store", b.Digest)
		}
	}
	reg.mu.Lock()
	for d := range reg.blobs {
		if reg.calls[d] != 1 {
			t.Errorf("the registry was asked %d times for %s", reg.calls[d], d)
		}
	}
	reg.mu.Unlock()

	n.setPinned(nil)
	for i := 0; ; i++ {
		if used, err := n.store.Usage(context.Background()); err == nil && used == 0 {
			break
		} else if i == 500 {
			t.Fatalf("the store keeps %d bytes after the unpin (%v)", used, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if hs := n.Holdings(context.Background()); len(hs) != 0 {
		t.Fatalf("holdings after the unpin: %+v", hs)
	}
}

// A kill -9 left a blob half written: the node started again releases it and keeps
// the blob whole.
func TestKeepAfterAKill(t *testing.T) {
	fastKeep(t)
	reg := newRegistry(t, 2, 64<<10)
	md := digest.FromBytes(reg.manifest)
	dir := filepath.Join(t.TempDir(), "blobs")
	killed, err := blobstore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ld digest.Digest
	for d, b := range reg.blobs {
		if len(b) > 1000 {
			ld = d
		}
	}
	w, err := killed.Writer(context.Background(), ld, -1)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(reg.blobs[ld][:1000]) // never committed nor closed: "kill -9"
	store, err := blobstore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := New(Config{}, store, logrus.New())
	n.Bind(Runtime{Registry: reg})
	n.setPinned([]string{repo + "@" + md.String()})
	run(t, n.Run)
	waitHeld(t, n, 10*time.Second)
	rd, size, err := store.Reader(context.Background(), ld)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	b, _ := io.ReadAll(rd)
	if size != int64(len(reg.blobs[ld])) || digest.FromBytes(b) != ld {
		t.Fatalf("the blob left half written by the kill: %d bytes stored, want %d that match", size, len(reg.blobs[ld]))
	}
}

// sharingNode is a node as imagepind runs it, sharing over HTTPS with the nodes at
// peers.
func sharingNode(t *testing.T, ca *testcerts.CA, dir, name, addr string, peers []string, reg mirror.Source) *Node {
	t.Helper()
	serving, err := ca.NodeServing(dir, name, net.ParseIP("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Node(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	n := newNode(t, Config{MirrorAddress: freeAddr(t), Address: addr, Nodes: peers,
		Cert: serving, ClientCA: ca.File, ClientCert: client, CA: ca.File, MaxServing: 8})
	n.Bind(Runtime{Registry: reg})
	if n.server == nil {
		t.Fatalf("%s shares nothing", name)
	}
	return n
}

// The cluster: three nodes pin an image their runtimes had already (the
// kubelet pulled it), so nothing is pulled through any mirror. Each node still comes to
// hold every blob of it, the registry sending one copy of each for the cluster. Then the
// registry goes, and a fourth node joins: it gets the whole image from its peers.
func TestKeptBlobsLetANodeJoinWithTheRegistryGone(t *testing.T) {
	fastKeep(t)
	reg := newRegistry(t, 4, 128<<10)
	md := digest.FromBytes(reg.manifest)
	ref := repo + "@" + md.String()
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "nodes-ca")
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for range 4 {
		addrs = append(addrs, freeAddr(t))
	}
	var nodes []*Node
	for i := range 3 {
		n := sharingNode(t, ca, dir, fmt.Sprintf("node-%d", i), addrs[i], addrs[:3], reg)
		n.setPinned([]string{ref})
		run(t, n.ServePeers)
		run(t, n.Run)
		nodes = append(nodes, n)
	}
	for _, n := range nodes {
		waitHeld(t, n, 20*time.Second)
	}
	reg.mu.Lock()
	for d := range reg.blobs {
		if reg.calls[d] != 1 {
			t.Errorf("the registry was asked %d times for %s", reg.calls[d], d)
		}
	}
	reg.mu.Unlock()

	reg.down.Store(true)
	late := sharingNode(t, ca, dir, "node-3", addrs[3], addrs, reg)
	late.setPinned([]string{ref})
	run(t, late.Serve)
	get := func(kind string, d digest.Digest) error {
		url := "http://" + late.cfg.MirrorAddress + "/v2/" + mirror.PathFor(repo) + "/" + kind + "/" + d.String()
		var resp *http.Response
		var err error
		for range 100 { // the listener starting
			if resp, err = http.Get(url); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK || digest.FromBytes(b) != d {
			return fmt.Errorf("%s %s: %d, %d bytes (%v)", kind, d, resp.StatusCode, len(b), err)
		}
		return nil
	}
	if err := get("manifests", md); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for d := range reg.blobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := get("blobs", d); err != nil {
				t.Errorf("with the registry gone, the joining node: %v", err)
			}
		}()
	}
	wg.Wait()
}

// someContent is containerd's content store holding the image but one layer, which it
// discarded once unpacked (discard_unpacked_layers).
type someContent struct {
	blobs map[digest.Digest][]byte
}

func (c someContent) Reader(_ context.Context, d digest.Digest) (io.ReadSeekCloser, int64, error) {
	b, ok := c.blobs[d]
	if !ok {
		return nil, 0, errdefs.ErrNotFound
	}
	return readSeekNopCloser{bytes.NewReader(b)}, int64(len(b)), nil
}

func (c someContent) Has(_ context.Context, d digest.Digest) (bool, error) {
	_, ok := c.blobs[d]
	return ok, nil
}

// On containerd the node serves its peers from containerd's content store, which
// holds what containerd pulled, before the pin or not: the node stores nothing of it.
// A layer containerd discarded once unpacked is the exception: the node fetches that
// one into its own store and keeps it there (the prune keeps what containerd lacks).
func TestOnContainerdTheNodeKeepsWhatTheContentStoreDiscarded(t *testing.T) {
	fastKeep(t)
	old := settleAfterFill
	settleAfterFill = 10 * time.Millisecond
	t.Cleanup(func() { settleAfterFill = old })
	reg := newRegistry(t, 3, 64<<10)
	md := digest.FromBytes(reg.manifest)
	content := someContent{blobs: map[digest.Digest][]byte{md: reg.manifest}}
	var discarded digest.Digest
	for d, b := range reg.blobs {
		if discarded == "" && len(b) > 1000 {
			discarded = d
			continue
		}
		content.blobs[d] = b
	}
	n := newNode(t, Config{})
	n.Bind(Runtime{Registry: reg, Content: content})
	n.setPinned([]string{repo + "@" + md.String()})
	run(t, n.Run)
	waitHeld(t, n, 10*time.Second)
	time.Sleep(100 * time.Millisecond) // a prune after the fill settled
	var stored []digest.Digest
	n.store.Walk(context.Background(), func(d digest.Digest, _ int64) error {
		stored = append(stored, d)
		return nil
	})
	if len(stored) != 1 || stored[0] != discarded {
		t.Fatalf("the store holds %v; want the discarded layer %s alone", stored, discarded)
	}
	if got := reg.attempts.Load(); got != 1 {
		t.Fatalf("the registry was asked %d times; want once, for the discarded layer", got)
	}
}
