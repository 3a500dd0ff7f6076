package registry

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/imagepin/imagepin/pullcreds"
	"github.com/imagepin/imagepin/test/registrytest"
)

// layersAll reads every image's manifest at once, as the disk check does.
func layersAll(t *testing.T, r *Client, images []string) map[string]Image {
	t.Helper()
	out := map[string]Image{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, image := range images {
		wg.Add(1)
		go func() {
			defer wg.Done()
			img, err := r.Layers(context.Background(), image)
			if err != nil {
				t.Errorf("%s: %v", image, err)
			}
			mu.Lock()
			out[image] = img
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// Many images of one registry are read over one connection with one ping, not a
// connection and a ping each as containers/image's image sources make; with the
// registry's Basic auth and the kubelet's credentials per namespace, and their
// uncompressed sizes (Range requests) on the same connection.
func TestManifestsShareOneConnectionAndPingPerRegistry(t *testing.T) {
	const n = 100
	reg := registrytest.New(t, map[string]string{"team": "alice:apass"})
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	var images []string
	want := map[string]uint64{}
	for i := range n {
		l := layer(t, 2000)
		ref := reg.Host + "/" + reg.Push(fmt.Sprintf("team/app-%03d", i), image(t, l), "alice:apass")
		images = append(images, ref)
		want[ref] = layerBytes(t, l)
	}
	k, err := pullcreds.ParseKeyring([]byte(fmt.Sprintf(`{"auths": {%q: {"username": "alice", "password": "apass"}}}`, reg.Host+"/team")))
	if err != nil {
		t.Fatal(err)
	}
	pings, conns := reg.Pings(), reg.Connections()
	r := New(Config{RegistriesConf: f.Conf, RegistriesConfDir: f.ConfDir, CertsDir: f.Certs, Platform: Platform{OS: "linux", Architecture: "amd64"}}, k.Lookup)
	for image, img := range layersAll(t, r, images) {
		if img.Bytes() != want[image] {
			t.Fatalf("%s: %d bytes, want %d", image, img.Bytes(), want[image])
		}
	}
	// Their uncompressed sizes, on the sources the manifests were read on.
	imgs, errs := resolveAll(r, images...)
	for _, image := range images {
		if errs[image] != nil || imgs[image].Layers[0].Uncompressed <= 0 {
			t.Fatalf("%s: %+v %v", image, imgs[image], errs[image])
		}
	}
	if got := reg.Pings() - pings; got != 1 {
		t.Fatalf("%d images: %d pings, want 1", n, got)
	}
	if got := reg.Connections() - conns; got > 2 {
		t.Fatalf("%d images: %d connections, want 1 (2 at most)", n, got)
	}
	if r.RangeRequests() < n {
		t.Fatalf("%d Range requests for %d layers", r.RangeRequests(), n)
	}
	// Without the credentials: what containers/image says, permanent.
	_, err = resolver(f, Platform{}, nil).Layers(context.Background(), images[0])
	if !IsUnavailable(err) || !strings.Contains(err.Error(), "unauthorized") {
		t.Fatalf("no credentials: %v (unavailable %v)", err, IsUnavailable(err))
	}
}
