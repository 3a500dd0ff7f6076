package registry

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/imagepin/imagepin/test/registrytest"
)

// The uncompressed sizes learned survive a restart (a new Client on the same file): no
// Range request the second time. A broken file is an empty cache.
func TestSizeCacheSurvivesARestart(t *testing.T) {
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	ref := reg.Host + "/" + reg.Push("cache/one", registrytest.Image(t, registrytest.RandomLayer(t, 4<<10), registrytest.RandomLayer(t, 2<<10)), "")
	file := SizeCacheIn(t.TempDir())
	client := func() *Client {
		return New(Config{RegistriesConf: f.Conf, RegistriesConfDir: f.ConfDir, CertsDir: f.Certs,
			Platform: Platform{OS: "linux", Architecture: "amd64"}, SizeCache: file}, nil)
	}
	first := client()
	img, err := first.Resolve(context.Background(), ref)
	if err != nil || first.RangeRequests() != 2 || img.Layers[0].Uncompressed == 0 {
		t.Fatalf("%v, %d Range requests, %+v", err, first.RangeRequests(), img.Layers)
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	second := client()
	again, err := second.Layers(context.Background(), ref)
	if err != nil || second.RangeRequests() != 0 {
		t.Fatalf("%v, %d Range requests", err, second.RangeRequests())
	}
	for i, l := range again.Layers {
		if l.Uncompressed != img.Layers[i].Uncompressed || l.From != img.Layers[i].From || l.MaxUncompressed != 0 {
			t.Fatalf("after a restart %+v, before %+v", l, img.Layers[i])
		}
	}
	os.WriteFile(file, []byte("{not json"), 0o600)
	if third := client(); len(third.usize) != 0 {
		t.Fatalf("a broken file gave %d sizes", len(third.usize))
	}
	if m, _ := filepath.Glob(filepath.Join(filepath.Dir(file), ".*")); len(m) != 0 {
		t.Fatalf("temporary files left: %v", m)
	}
}
