package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/diskcheck"
	"github.com/imagepin/imagepin/internal/bytesize"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/test/env"
	"github.com/imagepin/imagepin/test/goals"
)

// diskCost measures the disk check on many images: imagepin's check (cold, then from
// its cache) side by side with a naive check that asks the registry for every layer.
func (b *bench) diskCost(ctx context.Context, n int) error {
	// Push n images of 3 layers: one of 4 shared bases + 2 unique small layers.
	var bases []v1.Layer
	for i := 0; i < 4; i++ {
		l, err := env.RandomLayer(4 << 10)
		if err != nil {
			return err
		}
		bases = append(bases, l)
	}
	start := time.Now()
	var refs []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	var pushErr error
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			img, err := b.reg.PushRandom(ctx, fmt.Sprintf("cost/app-%03d", i), 2, 1<<10, bases[i%len(bases)])
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				pushErr = err
				return
			}
			refs = append(refs, img.Ref())
		}(i)
	}
	wg.Wait()
	if pushErr != nil {
		return pushErr
	}
	fmt.Fprintf(os.Stderr, "  pushed %d images in %s\n", n, time.Since(start).Round(time.Millisecond))

	// Every request to the registry goes through this counting proxy.
	host, requests, stop := countingProxy(b.reg.Host)
	defer stop()
	var viaProxy []string
	for _, r := range refs {
		viaProxy = append(viaProxy, strings.Replace(r, b.reg.Host, host, 1))
	}
	dir := filepath.Join(b.dir, "disk-cost")
	os.MkdirAll(filepath.Join(dir, "registries.conf.d"), 0o755)
	regConf := filepath.Join(dir, "registries.conf")
	os.WriteFile(regConf, []byte(fmt.Sprintf("[[registry]]\nlocation = %q\ninsecure = true\n", host)), 0o644)
	resolver := registry.New(registry.Config{RegistriesConf: regConf, RegistriesConfDir: filepath.Join(dir, "registries.conf.d"),
		CertsDir: filepath.Join(dir, "certs.d"), Platform: registry.Platform{OS: "linux", Architecture: "amd64"}}, nil)
	checker := diskcheck.New(diskcheck.Config{NodeName: "bench", Multiplier: 2, GCHighThresholdPercent: 85}, resolver,
		func(context.Context) (string, error) { return dir, nil })
	sets := []diskcheck.SetRequest{{Name: "release", Missing: viaProxy}}

	type row struct {
		name     string
		took     time.Duration
		requests int64
		layers   int
		bytes    uint64
	}
	var rows []row
	measure := func(name string, f func() (int, uint64, error)) error {
		requests.Store(0)
		start := time.Now()
		layers, bytes, err := f()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		rows = append(rows, row{name, time.Since(start), requests.Load(), layers, bytes})
		return nil
	}
	check := func() (int, uint64, error) {
		res, err := checker.Check(ctx, sets, nil)
		if err != nil {
			return 0, 0, err
		}
		v := res.Verdicts["release"]
		if len(v.Unsized)+len(v.Unavailable) > 0 {
			return 0, 0, fmt.Errorf("%d unsized, %d unavailable", len(v.Unsized), len(v.Unavailable))
		}
		var total uint64
		for _, by := range v.Bytes {
			total += by
		}
		return len(v.Bytes), total, nil
	}
	if err := measure("naive: ping + manifest + HEAD of every layer, per image (8 at once)", func() (int, uint64, error) { return naiveCheck(ctx, host, viaProxy) }); err != nil {
		return err
	}
	// Before: containers/image's own image source per image (a connection and a ping each).
	perImage := diskcheck.New(diskcheck.Config{NodeName: "bench", Multiplier: 2, GCHighThresholdPercent: 85},
		registry.New(registry.Config{RegistriesConf: regConf, RegistriesConfDir: filepath.Join(dir, "registries.conf.d"),
			CertsDir: filepath.Join(dir, "certs.d"), Platform: registry.Platform{OS: "linux", Architecture: "amd64"},
			ConnectionPerImage: true}, nil),
		func(context.Context) (string, error) { return dir, nil })
	if err := measure("imagepin check, cold, a connection and a ping per image (containers/image's image source each: the old way)", func() (int, uint64, error) {
		res, err := perImage.Check(ctx, sets, nil)
		if err != nil {
			return 0, 0, err
		}
		return len(res.Verdicts["release"].Bytes), 0, nil
	}); err != nil {
		return err
	}
	oldWay := rows[len(rows)-1]
	manifestsOnly := diskcheck.New(diskcheck.Config{NodeName: "bench", Multiplier: 2, GCHighThresholdPercent: 85},
		registry.New(registry.Config{RegistriesConf: regConf, RegistriesConfDir: filepath.Join(dir, "registries.conf.d"),
			CertsDir: filepath.Join(dir, "certs.d"), Platform: registry.Platform{OS: "linux", Architecture: "amd64"},
			NoUncompressedSizes: true}, nil),
		func(context.Context) (string, error) { return dir, nil })
	if err := measure("imagepin check, cold, manifests only (no uncompressed sizes: the baseline)", func() (int, uint64, error) {
		res, err := manifestsOnly.Check(ctx, sets, nil)
		if err != nil {
			return 0, 0, err
		}
		return len(res.Verdicts["release"].Bytes), 0, nil
	}); err != nil {
		return err
	}
	if err := measure(fmt.Sprintf("imagepin check, cold (one ping and connection per registry, a manifest per image; 8 images at once until the registry is measured far, then %d; a Range request per distinct layer only when the verdict depends on it: with this disk's room it does not)", registry.DefaultConcurrency), check); err != nil {
		return err
	}
	cold := rows[len(rows)-1]
	b.goals.Measured(goalP3, goals.Measurement{Value: cold.took.Seconds(), Detail: fmt.Sprintf("%d registry requests, one run", cold.requests),
		Baseline: fmt.Sprintf("a connection and a ping per image (the old way): %.2f s, %d requests", oldWay.took.Seconds(), oldWay.requests)})
	if err := measure("imagepin check again (manifests cached by digest)", check); err != nil {
		return err
	}
	// The same set against a disk with room for the real need but not for the most its
	// layers could hold: every distinct layer is sized (a Range request each).
	var summed uint64
	if res, err := checker.Check(ctx, sets, nil); err == nil {
		for _, by := range res.Verdicts["release"].Bytes {
			summed += by
		}
	}
	room := 4 * summed
	closeChecker := diskcheck.New(diskcheck.Config{NodeName: "bench", Multiplier: 2, GCHighThresholdPercent: 100,
		Statfs: func(string) (diskcheck.Space, error) {
			return diskcheck.Space{Capacity: 2 * room, Available: room}, nil
		}},
		registry.New(registry.Config{RegistriesConf: regConf, RegistriesConfDir: filepath.Join(dir, "registries.conf.d"),
			CertsDir: filepath.Join(dir, "certs.d"), Platform: registry.Platform{OS: "linux", Architecture: "amd64"}}, nil),
		func(context.Context) (string, error) { return dir, nil })
	if err := measure(fmt.Sprintf("imagepin check, cold, the verdict close (%s of room: every distinct layer sized, a Range request each)", bytesize.Human(room)), func() (int, uint64, error) {
		res, err := closeChecker.Check(ctx, sets, nil)
		if err != nil {
			return 0, 0, err
		}
		if v := res.Verdicts["release"]; !v.Admitted || strings.Contains(v.Condition.Message, "not asked") {
			return 0, 0, fmt.Errorf("the close check: admitted=%v, %s", v.Admitted, v.Condition.Message)
		}
		return len(res.Verdicts["release"].Bytes), 0, nil
	}); err != nil {
		return err
	}
	fmt.Printf("## P3: disk check cost, %d images, %d layer references (%d distinct), registry on loopback\n\n", n, 3*n, 2*n+len(bases))
	fmt.Printf("Registry requests counted by a proxy in front of docker-registry.\n\n| check | time | registry requests | requests per image |\n|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Printf("| %s | %d ms | %d | %.2f |\n", r.name, r.took.Milliseconds(), r.requests, float64(r.requests)/float64(n))
	}
	fmt.Printf("\nThe cold check took the registry for %s (least request %s).\n\n", nearOrFar(resolver.Far()), resolver.RoundTrip().Round(100*time.Microsecond))

	// The same check cold behind each slow link (the counting proxy behind it).
	for _, l := range b.links {
		if l.latencyMs == 0 {
			continue
		}
		via := strings.Replace(strings.Join(refs, "\n"), b.reg.Host, l.host, -1)
		ldir := filepath.Join(b.dir, "disk-cost-"+l.name)
		os.MkdirAll(filepath.Join(ldir, "registries.conf.d"), 0o755)
		conf := filepath.Join(ldir, "registries.conf")
		os.WriteFile(conf, []byte(fmt.Sprintf("[[registry]]\nlocation = %q\ninsecure = true\n", l.host)), 0o644)
		cold := func(perImage bool) (*registry.Client, time.Duration, error) {
			r := registry.New(registry.Config{RegistriesConf: conf, RegistriesConfDir: filepath.Join(ldir, "registries.conf.d"),
				CertsDir: filepath.Join(ldir, "certs.d"), Platform: registry.Platform{OS: "linux", Architecture: "amd64"}, ConnectionPerImage: perImage}, nil)
			chk := diskcheck.New(diskcheck.Config{NodeName: "bench", Multiplier: 2, GCHighThresholdPercent: 85}, r,
				func(context.Context) (string, error) { return ldir, nil })
			start := time.Now()
			res, err := chk.Check(ctx, []diskcheck.SetRequest{{Name: "release", Missing: strings.Split(via, "\n")}}, nil)
			took := time.Since(start)
			if err != nil || len(res.Verdicts["release"].Bytes) != n {
				return nil, 0, fmt.Errorf("disk check behind %s: %v (%d sized)", l.name, err, len(res.Verdicts["release"].Bytes))
			}
			return r, took, nil
		}
		_, before, err := cold(true)
		if err != nil {
			return err
		}
		r, took, err := cold(false)
		if err != nil {
			return err
		}
		rtt := 2 * time.Duration(l.latencyMs) * time.Millisecond
		waves := (n + registry.DefaultConcurrency - 1) / registry.DefaultConcurrency
		// Per image, one after another, with a connection and a ping each (the old way):
		// connect, ping, manifest, then its 2 unique layers' Range requests (each needs
		// the manifest): 5 round trips, in waves of DefaultConcurrency images.
		floor := time.Duration(waves*5) * rtt
		fmt.Printf("Behind the %s link (%s round trip, taken for %s): the cold check took %d ms, %.1f round trips (a connection and a ping per image, the old way: %d ms, %.2f× as long); the old way's floor at %d images at once (%d waves × 5 round trips each: connect, ping, manifest, 2 Range requests) is %d ms: %.2f× that floor. %d Range requests.\n\n",
			l.name, rtt, nearOrFar(r.Far()), took.Milliseconds(), float64(took)/float64(rtt), before.Milliseconds(), float64(before)/float64(took), registry.DefaultConcurrency, waves, floor.Milliseconds(), float64(took)/float64(floor), r.RangeRequests())
	}
	return nil
}

func nearOrFar(far bool) string {
	if far {
		return "far"
	}
	return "near"
}

// countingProxy is a reverse proxy to registry that counts requests.
func countingProxy(registry string) (host string, requests *atomic.Int64, stop func()) {
	requests = &atomic.Int64{}
	target, _ := url.Parse("http://" + registry)
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		proxy.ServeHTTP(w, r)
	}))
	return strings.TrimPrefix(srv.URL, "http://"), requests, srv.Close
}

// naiveCheck is what a script would do: for each image, ping, read the manifest, and
// HEAD every layer blob for its size.
func naiveCheck(ctx context.Context, host string, refs []string) (int, uint64, error) {
	var total atomic.Uint64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	client := &http.Client{Timeout: 30 * time.Second}
	for _, ref := range refs {
		wg.Add(1)
		sem <- struct{}{}
		go func(ref string) {
			defer wg.Done()
			defer func() { <-sem }()
			err := func() error {
				repoDigest := strings.TrimPrefix(ref, host+"/")
				repo, digest, _ := strings.Cut(repoDigest, "@")
				if resp, err := client.Get("http://" + host + "/v2/"); err != nil {
					return err
				} else {
					resp.Body.Close()
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+host+"/v2/"+repo+"/manifests/"+digest, nil)
				req.Header.Set("Accept", "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json")
				resp, err := client.Do(req)
				if err != nil {
					return err
				}
				var m struct {
					Layers []struct{ Digest string } `json:"layers"`
				}
				err = json.NewDecoder(resp.Body).Decode(&m)
				resp.Body.Close()
				if err != nil {
					return err
				}
				for _, l := range m.Layers {
					req, _ := http.NewRequestWithContext(ctx, http.MethodHead, "http://"+host+"/v2/"+repo+"/blobs/"+l.Digest, nil)
					resp, err := client.Do(req)
					if err != nil {
						return err
					}
					resp.Body.Close()
					total.Add(uint64(resp.ContentLength))
				}
				return nil
			}()
			if err != nil {
				mu.Lock()
				firstErr = err
				mu.Unlock()
			}
		}(ref)
	}
	wg.Wait()
	return len(refs), total.Load(), firstErr
}

// diskAccuracy pulls images through a fresh CRI-O and compares the check's estimate
// with how much the image filesystem really grew: the old rule (2 × compressed) and the
// need as the check computes it now (uncompressed + compressed where the blob says, the
// 2× rule as the floor), with the Range requests that cost.
func (b *bench) diskAccuracy(ctx context.Context) error {
	fmt.Printf("## Disk check accuracy: estimated need vs real growth of CRI-O's storage (10 images × 2 layers each)\n\n" +
		"| layers | compressed | storage grew (ratio) | 2 × compressed | ÷ growth | need now | ÷ growth | sized uncompressed | Range requests |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, kind := range []string{"incompressible", env.BinaryContent, env.TextContent} {
		var refs []string
		for i := 0; i < 10; i++ {
			var img env.Image
			var err error
			if kind == "incompressible" {
				img, err = b.reg.PushRandom(ctx, fmt.Sprintf("acc/random-%d", i), 2, 2<<20)
			} else {
				img, err = b.reg.PushContent(ctx, fmt.Sprintf("acc/%s-%d", kind, i), 2, 4<<20, kind)
			}
			if err != nil {
				return err
			}
			refs = append(refs, img.Ref())
		}
		c, err := b.freshCRIO(ctx, "crio-accuracy-"+kind[:4])
		if err != nil {
			return err
		}
		client, err := cri.Dial("unix://" + c.Socket)
		if err != nil {
			return err
		}
		resolver := registry.New(registry.Config{RegistriesConf: c.RegistriesConf(), RegistriesConfDir: c.RegistriesConfDir(),
			CertsDir: c.CertsDir(), Platform: registry.Platform{OS: "linux", Architecture: "amd64"}}, nil)
		var compressed, need, sized uint64
		layers := 0
		for _, r := range refs {
			img, err := resolver.Resolve(ctx, r)
			if err != nil {
				return err
			}
			for _, l := range img.Layers {
				layers++
				compressed += uint64(l.Size)
				need += diskcheck.Need(l, 2)
				if l.Uncompressed > 0 {
					sized++
				}
			}
		}
		before, _ := diskcheck.Statfs(c.Root())
		for _, r := range refs {
			if _, err := client.PullImage(ctx, r, nil); err != nil {
				return err
			}
		}
		after, _ := diskcheck.Statfs(c.Root())
		client.Close()
		c.Cleanup()
		grew := after.Used() - before.Used()
		fmt.Printf("| %s | %s | %s (%.1f:1) | %s | %.2f | %s | %.2f | %d of %d | %d |\n", kind, bytesize.Human(compressed), bytesize.Human(grew),
			float64(grew)/float64(compressed), bytesize.Human(2*compressed), float64(2*compressed)/float64(grew),
			bytesize.Human(need), float64(need)/float64(grew), sized, layers, resolver.RangeRequests())
	}
	fmt.Println()
	return nil
}
