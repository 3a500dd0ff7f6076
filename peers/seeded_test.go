package peers

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	ggcrlayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepin/imagepin/seed"
	"github.com/imagepin/imagepin/status"
)

// A pinned image seeded on one node only, with no registry at all: the other node
// gets its manifest and every blob from that node's store, as any stored blob.
func TestASeededImageIsServedToPeers(t *testing.T) {
	img, err := random.Image(128<<10, 4)
	if err != nil {
		t.Fatal(err)
	}
	reg := registryOf(img)
	reg.down.Store(true)
	c := newCluster(t, reg, 2)
	dir := filepath.Join(t.TempDir(), "oci")
	p, err := ggcrlayout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, ggcrlayout.WithAnnotations(map[string]string{ocispec.AnnotationRefName: repo + ":v1"})); err != nil {
		t.Fatal(err)
	}
	seeded := c.nodes[0]
	seeder := seed.New(seed.Config{Dir: seed.Dir(filepath.Join(c.dir, "state-0")), StoreDir: filepath.Join(c.dir, "node-0")}, seed.Deps{Store: seeded.store})
	if _, err := seeder.Seed(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	other := c.nodes[1]
	if err := c.pull(other); err != nil {
		t.Fatalf("the node without the seed: %v", err)
	}
	if got, want := other.stats.FromPeers.Load(), c.size(); got != want {
		t.Fatalf("the node without the seed read %d bytes from its peer, want %d", got, want)
	}
	if n := seeded.stats.ToPeers.Load(); n != c.size() {
		t.Fatalf("the seeded node served %d bytes, want %d", n, c.size())
	}
	if err := c.pull(seeded); err != nil {
		t.Fatalf("the seeded node itself: %v", err)
	}
}

// The node's status counts a seed's blobs as stored (Stamp), and carries its seeds'
// totals, read again when a seed comes, through seed.Report (which the agent takes into
// the status it compares); an unreadable record is a fault (the prune is off).
func TestStampShowsTheSeeds(t *testing.T) {
	root := t.TempDir()
	seeds := seed.Dir(filepath.Join(root, "state"))
	n := newNode(t, Config{SeedsDir: seeds})
	report := seed.NewReport(seeds, "")
	stamp := func() status.Node {
		var got status.Node
		n.Stamp(func(s status.Node) { got = s })(status.Node{})
		var faults []string
		got.Node.Seeded, faults = report.Status(nil)
		got.Faults = append(got.Faults, faults...)
		return got
	}
	if s := stamp(); s.Node.Seeded != nil || len(s.Faults) != 0 {
		t.Fatalf("no seeds: %+v %v", s.Node.Seeded, s.Faults)
	}
	img, err := random.Image(64<<10, 2)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "oci")
	p, err := ggcrlayout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, ggcrlayout.WithAnnotations(map[string]string{ocispec.AnnotationRefName: repo + ":v1"})); err != nil {
		t.Fatal(err)
	}
	sum, err := seed.New(seed.Config{Dir: seeds, StoreDir: root}, seed.Deps{Store: n.store}).Seed(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	s := stamp()
	if want := (status.Seeded{Seeds: 1, Images: 1, Bytes: sum.Bytes}); s.Node.Seeded == nil || *s.Node.Seeded != want || s.Node.Peers.Stored < sum.Bytes {
		t.Fatalf("seeded %+v (stored %d), want %+v", s.Node.Seeded, s.Node.Peers.Stored, want)
	}
	if err := os.WriteFile(filepath.Join(seeds, "0123456789abcdef.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s := stamp(); len(s.Faults) != 1 || !strings.Contains(s.Faults[0], "not pruned") {
		t.Fatalf("an unreadable record: faults %v", s.Faults)
	}
}
