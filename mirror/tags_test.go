package mirror

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/opencontainers/go-digest"
)

// A pinned tag is answered with its pinned digest's manifest, and a real client pulls
// the image by that tag (config and layers through the same endpoint); another tag of
// the same repository, and a pinned tag whose digest is not pinned, are 404s at once.
func TestPinnedTagAnsweredWithItsDigest(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	pinned := map[string]bool{repo + "@" + d.String(): true}
	s := serve(t, src, func(r string, dd digest.Digest) bool { return pinned[r+"@"+dd.String()] })
	lookup := func(r, tag string) (digest.Digest, bool) {
		switch {
		case r == repo && tag == "v1":
			return digest.Digest(d.String()), true
		case r == repo && tag == "stale":
			return digest.FromString("not pinned"), true
		}
		return "", false
	}
	srv := httptest.NewServer(WithTags(s.m.Handler(src, s.stats), lookup))
	t.Cleanup(srv.Close)

	ref, err := name.NewTag(strings.TrimPrefix(srv.URL, "http://")+"/"+repo+":v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	if gd, _ := got.Digest(); gd != d {
		t.Fatalf("the tag gave %s, want the pinned %s", gd, d)
	}
	layers, _ := got.Layers()
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, rc); err != nil {
			t.Fatal(err)
		}
		rc.Close()
	}

	calls := src.calls.Load()
	for _, tag := range []string{"v2", "latest", "stale"} {
		resp, err := http.Get(srv.URL + "/v2/" + repo + "/manifests/" + tag)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("tag %s: %d, want 404", tag, resp.StatusCode)
		}
	}
	if src.calls.Load() != calls {
		t.Fatal("an unpinned tag asked the source")
	}
	// The plain handler answers no tag at all.
	resp, err := http.Get(s.srv.URL + "/v2/" + repo + "/manifests/v1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("the handler without tags answered a tag: %d", resp.StatusCode)
	}
}
