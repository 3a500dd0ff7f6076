package registry

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/imagepin/imagepin/pullcreds"
	"github.com/imagepin/imagepin/test/registrytest"
)

var (
	layer      = registrytest.RandomLayer
	image      = registrytest.Image
	layerBytes = registrytest.LayerBytes
	newFiles   = registrytest.NewFiles
)

// silentListener accepts connections and never answers them: a registry that hangs.
func silentListener(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	return l
}

func resolver(f registrytest.Files, p Platform, creds Credentials) *Client {
	if p.OS == "" {
		p = Platform{OS: "linux", Architecture: "amd64"}
	}
	return New(Config{RegistriesConf: f.Conf, RegistriesConfDir: f.ConfDir, CertsDir: f.Certs, Platform: p, Concurrency: 4}, creds)
}

// A disconnected cluster: the source does not exist, only its digest mirror answers,
// over TLS trusted through certs.d.
func TestMirrorOnlySourceWithCertsDir(t *testing.T) {
	reg := registrytest.New(t, nil)
	l1, l2 := layer(t, 3000), layer(t, 5000)
	repoDigest := reg.Push("ocp/release", image(t, l1, l2), "")
	digest := strings.SplitN(repoDigest, "@", 2)[1]
	f := newFiles(t, fmt.Sprintf(`[[registry]]
prefix = "upstream.example.invalid/ocp"
location = "upstream.example.invalid/ocp"
[[registry.mirror]]
location = %q
pull-from-mirror = "digest-only"
`, reg.Host+"/ocp"))
	src := "upstream.example.invalid/ocp/release@" + digest

	// Without the CA the mirror's TLS fails and the source does not resolve: an error
	// listing both endpoints, transient (it may be fixed by itself: not Unavailable).
	_, err := resolver(f, Platform{}, nil).Resolve(context.Background(), src)
	if err == nil || IsUnavailable(err) || !strings.Contains(err.Error(), reg.Host) || !strings.Contains(err.Error(), "upstream.example.invalid") {
		t.Fatalf("without the CA: %v", err)
	}
	if !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("the TLS failure should be named: %v", err)
	}

	reg.WriteCA(f.Certs)
	img, err := resolver(f, Platform{}, nil).Resolve(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	if img.Bytes() != layerBytes(t, l1, l2) || len(img.Layers) != 2 {
		t.Fatalf("sized %d bytes in %d layers, want %d in 2", img.Bytes(), len(img.Layers), layerBytes(t, l1, l2))
	}

	// A digest-only mirror is not asked for a tag: only the (missing) source is.
	_, err = resolver(f, Platform{}, nil).Resolve(context.Background(), "upstream.example.invalid/ocp/release:latest")
	if err == nil || strings.Contains(err.Error(), reg.Host) {
		t.Fatalf("a tag must not go to a digest-only mirror: %v", err)
	}
}

// A mirror that needs credentials: containers/image never sends a mirror the credentials
// the kubelet hands over for the image's own registry; it looks the mirror's host up in
// the global auth file, which is where CRI-O (global_auth_file) finds them too.
func TestMirrorCredentialsFromTheGlobalAuthFile(t *testing.T) {
	reg := registrytest.New(t, map[string]string{"ocp": "mirror-user:mpass"})
	repoDigest := reg.Push("ocp/release", image(t, layer(t, 3000)), "mirror-user:mpass")
	f := newFiles(t, fmt.Sprintf("[[registry]]\nprefix = \"upstream.example.invalid/ocp\"\nlocation = \"upstream.example.invalid/ocp\"\n[[registry.mirror]]\nlocation = %q\n", reg.Host+"/ocp"))
	reg.WriteCA(f.Certs)
	src := "upstream.example.invalid/ocp/release@" + strings.SplitN(repoDigest, "@", 2)[1]
	secret := fmt.Sprintf(`{"auths": {"upstream.example.invalid": {"username": "source-user", "password": "spass"}, %q: {"auth": %q}}}`,
		reg.Host, base64.StdEncoding.EncodeToString([]byte("mirror-user:mpass")))
	authFile := filepath.Join(f.Dir, "config.json")
	if err := os.WriteFile(authFile, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := pullcreds.ParseKeyring([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	// The kubelet's credentials alone (those of upstream.example.invalid) do not reach the mirror.
	if _, err := resolver(f, Platform{}, k.Lookup).Resolve(context.Background(), src); err == nil || !strings.Contains(err.Error(), "unauthorized") {
		t.Fatalf("without the global auth file: %v", err)
	}
	r := New(Config{RegistriesConf: f.Conf, RegistriesConfDir: f.ConfDir, CertsDir: f.Certs, AuthFile: authFile,
		Platform: Platform{OS: "linux", Architecture: "amd64"}}, k.Lookup)
	if _, err := r.Resolve(context.Background(), src); err != nil {
		t.Fatalf("with the global auth file: %v", err)
	}
}

// Credentials keyed by namespace, as the kubelet matches them.
func TestCredentialsByNamespace(t *testing.T) {
	reg := registrytest.New(t, map[string]string{"team-a": "alice:apass", "team-b": "bob:bpass"})
	a := reg.Push("team-a/app", image(t, layer(t, 1000)), "alice:apass")
	b := reg.Push("team-b/app", image(t, layer(t, 2000)), "bob:bpass")
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	secret := fmt.Sprintf(`{"auths": {%q: {"username": "alice", "password": "apass"}, %q: {"username": "bob", "password": "bpass"}, %q: {"username": "nobody", "password": "x"}}}`,
		reg.Host+"/team-a", reg.Host+"/team-b", reg.Host)
	k, err := pullcreds.ParseKeyring([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	r := resolver(f, Platform{}, k.Lookup)
	for _, ref := range []string{a, b} {
		if _, err := r.Resolve(context.Background(), reg.Host+"/"+ref); err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
	}
	// Without credentials: access denied is permanent.
	_, err = resolver(f, Platform{}, nil).Resolve(context.Background(), reg.Host+"/"+a)
	if !IsUnavailable(err) {
		t.Fatalf("no credentials: %v (unavailable %v)", err, IsUnavailable(err))
	}
}

// An OCI index and a Docker manifest list resolve per platform; a platform the list
// lacks is Unavailable, naming the platforms it has.
func TestManifestListsPerPlatform(t *testing.T) {
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	amdL, armL := layer(t, 4000), layer(t, 7000)
	amd, arm := image(t, amdL), image(t, armL)
	for _, kind := range []types.MediaType{types.OCIImageIndex, types.DockerManifestList} {
		idx := mutate.AppendManifests(empty.Index,
			mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
			mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}}},
		)
		idx = mutate.IndexMediaType(idx, kind)
		repo := map[types.MediaType]string{types.OCIImageIndex: "multi/oci", types.DockerManifestList: "multi/docker"}[kind]
		ref := reg.Host + "/" + reg.PushIndex(repo, idx, "")
		for p, want := range map[Platform]uint64{
			{OS: "linux", Architecture: "amd64"}:                layerBytes(t, amdL),
			{OS: "linux", Architecture: "arm64", Variant: "v8"}: layerBytes(t, armL),
		} {
			img, err := resolver(f, p, nil).Resolve(context.Background(), ref)
			if err != nil || img.Bytes() != want {
				t.Fatalf("%s for %s: %d bytes, %v; want %d", kind, p, img.Bytes(), err, want)
			}
		}
		_, err := resolver(f, Platform{OS: "linux", Architecture: "s390x"}, nil).Resolve(context.Background(), ref)
		if !IsUnavailable(err) || !strings.Contains(err.Error(), "has no manifest for linux/s390x") ||
			!strings.Contains(err.Error(), "linux/amd64, linux/arm64/v8") || !strings.Contains(err.Error(), ref) {
			t.Fatalf("%s for s390x: %v", kind, err)
		}
	}
}

// The cache makes a second check free: no request reaches the registry.
func TestResolverCachesByDigest(t *testing.T) {
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	ref := reg.Host + "/" + reg.Push("c/app", image(t, layer(t, 100)), "")
	r := resolver(f, Platform{}, nil)
	if _, err := r.Resolve(context.Background(), ref); err != nil {
		t.Fatal(err)
	}
	before := reg.Requests()
	if _, err := r.Resolve(context.Background(), ref); err != nil {
		t.Fatal(err)
	}
	if after := reg.Requests(); after != before {
		t.Fatalf("a cached image cost %d requests", after-before)
	}
	t.Logf("one image cold: %d requests (ping, manifest)", before)
}

// A registry that accepts connections and never answers costs one image its sizing
// (unsized, retried later), after the per-image timeout; the others are sized.
func TestStalledRegistryLeavesOnlyItsImagesUnsized(t *testing.T) {
	l := silentListener(t)
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	good := reg.Host + "/" + reg.Push("a/good", image(t, layer(t, 2000)), "")
	stalled := l.Addr().String() + "/x/stalled@sha256:" + strings.Repeat("5", 64)
	r := New(Config{RegistriesConf: f.Conf, RegistriesConfDir: f.ConfDir, CertsDir: f.Certs,
		Platform: Platform{OS: "linux", Architecture: "amd64"}, Timeout: 300 * time.Millisecond}, nil)
	start := time.Now()
	imgs, errs := resolveAll(r, good, stalled)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("resolving waited %s for a stalled registry", took)
	}
	if errs[good] != nil || imgs[good].Bytes() == 0 || errs[stalled] == nil || !strings.Contains(errs[stalled].Error(), "no answer from its registry within 300ms") {
		t.Fatalf("%+v %v", imgs, errs)
	}
}

// resolveAll resolves every image at once, as the disk check does.
func resolveAll(r *Client, images ...string) (map[string]Image, map[string]error) {
	imgs, errs := map[string]Image{}, map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, image := range images {
		wg.Add(1)
		go func() {
			defer wg.Done()
			img, err := r.Resolve(context.Background(), image)
			mu.Lock()
			imgs[image], errs[image] = img, err
			mu.Unlock()
		}()
	}
	wg.Wait()
	return imgs, errs
}

// A far registry is sized many images at once, within the first check: the sizings that
// wait for the narrower bound (eight at once, while the registry is near or not measured)
// go on as soon as two sizings measure it far.
func TestFarRegistryWidensWithinTheCheck(t *testing.T) {
	reg, check := farRegistry(t, 40, 50*time.Millisecond)
	start := time.Now()
	rt := check()
	if got := reg.MaxInFlight(); got <= nearWidth {
		t.Fatalf("a registry 50 ms away was asked at most %d requests at once: the sizings stayed %d at a time", got, nearWidth)
	}
	if rt < farFrom {
		t.Fatalf("round trip %s, want ≥ %s", rt, farFrom)
	}
	t.Logf("40 images, 50 ms a request: %s", time.Since(start))
}

// A registry too far for its first sizings to measure it within unmeasuredFor is taken
// for far then: the other images do not wait out the first eight's round trips.
func TestUnmeasuredRegistryIsTakenForFar(t *testing.T) {
	reg, check := farRegistry(t, 16, 400*time.Millisecond)
	early := make(chan int64, 1)
	// The registry's one ping is back at 400 ms; before the first manifest is (800 ms),
	// every image is asked.
	time.AfterFunc(700*time.Millisecond, func() { early <- reg.MaxInFlight() })
	check()
	if got := <-early; got <= nearWidth {
		t.Fatalf("%d requests at once before the registry was measured: the others waited for the first %d", got, nearWidth)
	}
}

// farRegistry is a registry with n one-layer images whose every request waits delay, and
// a cold resolution of them all that must size each image; it returns the round trip
// measured.
func farRegistry(t *testing.T, n int, delay time.Duration) (*registrytest.Registry, func() time.Duration) {
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	var missing []string
	for i := range n {
		missing = append(missing, reg.Host+"/"+reg.Push(fmt.Sprintf("far/app%d", i), image(t, layer(t, 100)), ""))
	}
	reg.SetDelay(delay)
	reg.MaxInFlight() // reset: the pushes above are not the check's requests
	r := New(Config{RegistriesConf: f.Conf, RegistriesConfDir: f.ConfDir, CertsDir: f.Certs,
		Platform: Platform{OS: "linux", Architecture: "amd64"}}, nil)
	return reg, func() time.Duration {
		imgs, errs := resolveAll(r, missing...)
		for _, m := range missing {
			if errs[m] != nil || imgs[m].Bytes() == 0 {
				t.Fatalf("%s: %v", m, errs[m])
			}
		}
		return r.RoundTrip()
	}
}

// An image's Range requests run one after another on its connection while the
// registry is near, and several at once when it is far (each a round trip waited for).
func TestRangeRequestsAtOnceWhenFar(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration
		want  int64
	}{
		// Near: its ping and manifest answer before the registry could be taken for
		// far (unmeasuredFor); the Range requests then run one at a time.
		{"near", 5 * time.Millisecond, 1},
		// Far: no answer within unmeasuredFor.
		{"far", 100 * time.Millisecond, farRangesPerImage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := registrytest.New(t, nil)
			f := newFiles(t, "")
			reg.WriteCA(f.Certs)
			ref := reg.Host + "/" + reg.Push("far/app", image(t, layer(t, 100), layer(t, 200), layer(t, 300), layer(t, 400), layer(t, 500)), "")
			reg.SetDelay(tc.delay)
			reg.MaxInFlight() // the pushes are not the resolution's
			r := resolver(f, Platform{}, nil)
			img, err := r.Resolve(context.Background(), ref)
			if err != nil || len(img.Layers) != 5 {
				t.Fatalf("%+v %v", img, err)
			}
			for _, l := range img.Layers {
				if l.Uncompressed <= 0 {
					t.Fatalf("layer %s not sized: %+v", l.Digest, l)
				}
			}
			if got := reg.MaxInFlight(); got != tc.want {
				t.Fatalf("%d requests at once, want %d", got, tc.want)
			}
		})
	}
}
