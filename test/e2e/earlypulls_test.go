//go:build e2e

package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
)

// rangeDelayProxy serves the registry at host, holding every Range request (the disk
// check's uncompressed sizes; a pull asks whole blobs) delay before passing it on: a
// check that waits on its registry while the pulls it allows go fast. It returns the
// proxy's host:port and the count of Range requests.
func rangeDelayProxy(t *testing.T, host string, delay time.Duration) (string, *atomic.Int64) {
	t.Helper()
	target, _ := url.Parse("http://" + host)
	rp := httputil.NewSingleHostReverseProxy(target)
	var ranges atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Range") != "" {
			ranges.Add(1)
			select {
			case <-time.After(delay):
			case <-r.Context().Done():
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), &ranges
}

// On an 80 MiB image filesystem (room 68 MiB under the GC threshold), a set whose need
// the manifests cannot decide: its small image fits even at the most its layer could
// decompress to, so it is pulled while the check asks the layers' uncompressed sizes
// (each Range request held 3 s); the sizes then show the set does not fit. The refusal
// leaves the early image on the node, unpinned, and says so; the set's other images are
// neither pulled nor pinned; an admitted set's pins stay; CRI-O's config still parses.
func TestRefusalAfterPullsBeforeTheVerdict(t *testing.T) {
	var proxy string
	var ranges *atomic.Int64
	w := newWorldWith(t, func(reg string) env.CRIOOptions {
		proxy, ranges = rangeDelayProxy(t, reg, 3*time.Second)
		return env.CRIOOptions{RootSize: "80m", Insecure: []string{proxy}}
	})
	via := func(refs ...string) []string {
		var out []string
		for _, r := range refs {
			out = append(out, strings.Replace(r, w.reg.Host, proxy, 1))
		}
		return out
	}
	ctx := context.Background()
	keep := via(w.push("keep", 1)...)
	small, err := w.reg.PushRandom(ctx, "early-small", 1, 32<<10)
	if err != nil {
		t.Fatal(err)
	}
	var big []string
	for _, name := range []string{"late-big-1", "late-big-2"} {
		// About 11 MiB of gzip each, 40 MiB once unpacked: the manifests say 23 MiB at
		// the floor, the layers' trailers say 51 MiB.
		img, err := w.reg.PushContent(ctx, name, 2, 20<<20, env.TextContent)
		if err != nil {
			t.Fatal(err)
		}
		big = append(big, img.Ref())
	}
	early := via(small.Ref())
	big = via(big...)
	w.startDaemon()

	w.writeSet("aa-keep.yaml", alphaSet("aa-keep", keep...))
	w.waitFor("aa-keep Ready", 60*time.Second, phaseIs("aa-keep", status.Ready))
	w.requirePinned(keep...)

	w.writeSet("bb-grow.yaml", alphaSet("bb-grow", append(slices.Clone(early), big...)...))
	n := w.waitFor("bb-grow refused", 90*time.Second, phaseIs("bb-grow", status.Failed))
	c := n.Set("bb-grow").Condition(status.ConditionFailed)
	if c.Reason != status.ReasonInsufficientDiskSpace || !strings.Contains(c.Message, "the 1 pulled while the check ran stay on the node, unpinned") {
		t.Fatalf("refusal: %+v", c)
	}
	if ranges.Load() == 0 {
		t.Fatal("the check asked no uncompressed size: the manifests decided, and nothing could be pulled before the verdict")
	}
	log, _ := os.ReadFile(filepath.Join(w.dir, "imagepind.log"))
	if !strings.Contains(string(log), "pulling images while the disk check sizes the set") {
		t.Fatal("no pull before the verdict in imagepind's log")
	}
	// The early image stays, unpinned, at once; the others were never pulled; the
	// admitted set keeps its pins.
	live := w.livePins()
	if img := w.image(early[0]); !img.Present || img.Pinned || slices.Contains(live, early[0]) {
		t.Fatalf("%s after the refusal: present %v, pinned %v, in pinned_images %v: want present and unpinned", early[0], img.Present, img.Pinned, slices.Contains(live, early[0]))
	}
	w.requireAbsentAndUnpinned(big...)
	w.requirePinned(keep...)

	// It stays so: the refused set is not pulled, and the early image not pinned again.
	time.Sleep(3 * time.Second)
	later := w.readStatus()
	if s := later.Set("bb-grow"); s == nil || s.Phase != status.Failed {
		t.Fatalf("bb-grow later: %+v", s)
	}
	if img := w.image(early[0]); !img.Present || img.Pinned {
		t.Fatalf("%s later: present %v, pinned %v", early[0], img.Present, img.Pinned)
	}
	w.requireAbsentAndUnpinned(big...)
	w.requirePinned(keep...)
}
