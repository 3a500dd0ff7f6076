package peers

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	ggcrlayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepin/imagepin/seed"
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
