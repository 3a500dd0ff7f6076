package mirror

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/opencontainers/go-digest"
)

// TagLookup is the pinned digest of a tag a set pins (repo as in the set: its full
// name), and whether a set pins it.
type TagLookup func(repo, tag string) (digest.Digest, bool)

// WithTags serves h (a Handler) and also answers the manifest of a pinned tag: with the
// manifest of its pinned digest, as h serves that digest (only while it is pinned). Any
// other tag is a 404 at once, so the client goes on to its registry. Only an endpoint
// no other local process can stand in for may answer tags (a TLS endpoint whose CA only
// imagepind holds): whoever answers a tag chooses the image behind it.
func WithTags(h http.Handler, lookup TagLookup) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		repo, kind, ref, ok := parsePath(r.URL.Path)
		if !ok || kind != "manifests" {
			h.ServeHTTP(w, r)
			return
		}
		if _, err := digest.Parse(ref); err == nil {
			h.ServeHTTP(w, r)
			return
		}
		d, pinned := lookup(repo, ref)
		if !pinned {
			notFound(w, "MANIFEST_UNKNOWN", fmt.Sprintf("tag %s is not pinned on this node", ref))
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = strings.TrimSuffix(r.URL.Path, ref) + d.String()
		r2.URL.RawPath = ""
		h.ServeHTTP(w, r2)
	})
}
