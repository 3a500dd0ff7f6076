package diskcheck

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/test/registrytest"
)

// The need of a layer: the floor (multiplier × compressed) for an unknown uncompressed
// size, uncompressed + compressed where that is larger; saturating.
func TestNeed(t *testing.T) {
	if n := Need(registry.Layer{Size: 100}, 2); n != 200 {
		t.Fatalf("floor: %d", n)
	}
	if n := Need(registry.Layer{Size: 100, Uncompressed: 500}, 2); n != 600 {
		t.Fatalf("uncompressed + compressed: %d", n)
	}
	if n := Need(registry.Layer{Size: 100, Uncompressed: 50}, 2); n != 200 {
		t.Fatalf("the floor stays: %d", n)
	}
	if n := Need(registry.Layer{}, 2); n != 0 {
		t.Fatalf("no size: %d", n)
	}
	if n := Need(registry.Layer{Size: math.MaxInt64}, 3); n != math.MaxUint64 {
		t.Fatalf("saturation: %d", n)
	}
}

// A zstd frame claiming 2^62 bytes is an unknown size (package registry), so the set
// needs the floor and is admitted for what it really needs; before the fix the sums
// wrapped and the message said "4.0 MiB" for a need past any disk.
func TestImplausibleHeaderNeedsTheFloor(t *testing.T) {
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	ref := reg.Host + "/" + reg.Push("u/hostile", registrytest.ForgedZstdImage(t), "")
	c := New(Config{NodeName: "n1", Multiplier: 2, GCHighThresholdPercent: 85},
		resolver(f, registry.Platform{}, nil), func(context.Context) (string, error) { return "/var/lib/containers/storage", nil })
	c.statfs = func(string) (Space, error) { return Space{Capacity: 10 << 30, Available: 5 << 30}, nil }
	res, err := c.Check(context.Background(), []SetRequest{{Name: "s", Missing: []string{ref}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v := res.Verdicts["s"]; !v.Admitted || !strings.Contains(v.Condition.Message, "need 8.0 MiB") {
		t.Fatalf("verdict %+v", v.Condition)
	}
}
