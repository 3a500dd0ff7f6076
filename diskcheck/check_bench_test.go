package diskcheck

import (
	"context"
	"fmt"
	"testing"

	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/test/registrytest"
)

// BenchmarkCheck500 is the disk check of 500 images (1000+ distinct layers) against an
// in-process TLS registry, cold (a new resolver each time), by sizing concurrency and
// with or without the uncompressed sizes, over one connection per registry and (the
// baseline, connection=per-image) over an image source of containers/image per image:
// go test -run '^$' -bench Check500 ./diskcheck
func BenchmarkCheck500(b *testing.B) {
	t := &testing.T{}
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	var refs []string
	base := layer(t, 4<<10)
	for i := 0; i < 500; i++ {
		refs = append(refs, reg.Host+"/"+reg.Push(fmt.Sprintf("cost/app-%03d", i), image(t, base, layer(t, 1<<10), layer(t, 1<<10)), ""))
	}
	for _, c := range []struct {
		conc     int
		ranges   bool
		perImage bool
	}{{8, false, true}, {8, false, false}, {8, true, false}, {32, false, false}, {32, true, false}, {registry.DefaultConcurrency, false, true}, {registry.DefaultConcurrency, false, false}} {
		conn := "shared"
		if c.perImage {
			conn = "per-image"
		}
		b.Run(fmt.Sprintf("connection=%s/concurrency=%d/ranges=%v", conn, c.conc, c.ranges), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				before, pings, conns := reg.Requests(), reg.Pings(), reg.Connections()
				r := registry.New(registry.Config{RegistriesConf: f.Conf, RegistriesConfDir: f.ConfDir, CertsDir: f.Certs,
					Platform: registry.Platform{OS: "linux", Architecture: "amd64"}, Concurrency: c.conc, NoUncompressedSizes: !c.ranges,
					ConnectionPerImage: c.perImage}, nil)
				chk := New(Config{NodeName: "b", Multiplier: 2}, r, func(context.Context) (string, error) { return f.Dir, nil })
				res, err := chk.Check(context.Background(), []SetRequest{{Name: "s", Missing: refs}}, nil)
				if err != nil || len(res.Verdicts["s"].Bytes) != 500 {
					b.Fatalf("%v %d", err, len(res.Verdicts["s"].Bytes))
				}
				b.ReportMetric(float64(reg.Requests()-before)/500, "requests/image")
				b.ReportMetric(float64(reg.Pings()-pings), "pings")
				b.ReportMetric(float64(reg.Connections()-conns), "connections")
			}
		})
	}
}
