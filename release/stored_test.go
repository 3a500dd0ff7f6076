package release_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/release"
	"github.com/imagepin/imagepin/release/releasetest"
)

// mapStore is a node's blob store in memory.
type mapStore map[digest.Digest][]byte

func (s mapStore) Reader(_ context.Context, d digest.Digest) (io.ReadSeekCloser, int64, error) {
	b, ok := s[d]
	if !ok {
		return nil, 0, io.ErrUnexpectedEOF
	}
	return nopSeekCloser{bytes.NewReader(b)}, int64(len(b)), nil
}

type nopSeekCloser struct{ *bytes.Reader }

func (nopSeekCloser) Close() error { return nil }

// seed copies the release image (its index, every instance, configs and layers) from the
// registry at host into s, as imagepinctl seed would from media.
func (s mapStore) seed(t *testing.T, host, repo string, d digest.Digest) {
	t.Helper()
	ref, err := name.NewDigest(host+"/"+repo+"@"+d.String(), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(ref)
	if err != nil {
		t.Fatal(err)
	}
	s[digest.FromBytes(desc.Manifest)] = desc.Manifest
	var imgs []v1.Image
	if desc.MediaType.IsIndex() {
		idx, _ := desc.ImageIndex()
		m, _ := idx.IndexManifest()
		for _, c := range m.Manifests {
			img, err := idx.Image(c.Digest)
			if err != nil {
				t.Fatal(err)
			}
			imgs = append(imgs, img)
		}
	} else {
		img, _ := desc.Image()
		imgs = append(imgs, img)
	}
	for _, img := range imgs {
		raw, _ := img.RawManifest()
		s[digest.FromBytes(raw)] = raw
		cfg, _ := img.RawConfigFile()
		s[digest.FromBytes(cfg)] = cfg
		ls, _ := img.Layers()
		for _, l := range ls {
			rc, _ := l.Compressed()
			b, _ := io.ReadAll(rc)
			rc.Close()
			s[digest.FromBytes(b)] = b
		}
	}
}

// A release image seeded on the node (with its OS images, whose labels name their
// streams) expands from the node's store with no registry
// request, single and multi-architecture; an image the store lacks still goes to its
// registry.
func TestSeededReleaseExpandsWithNoRegistry(t *testing.T) {
	for _, multi := range []bool{false, true} {
		t.Run(map[bool]string{false: "single", true: "multi"}[multi], func(t *testing.T) {
			r := newReg(t)
			p := r.push(t, releasetest.Options{Version: "4.20.2", Components: 5, Multi: multi})
			d := digest.Digest(p.Release[strings.LastIndex(p.Release, "@")+1:])
			store := mapStore{}
			store.seed(t, r.host, "ocp/release", d)
			// The OS images' labels name their streams: a site's media carry them too.
			for _, ref := range p.OS {
				at := strings.LastIndex(ref, "@")
				repo := strings.TrimPrefix(ref[:at], "upstream.example.invalid/")
				store.seed(t, r.host, repo, digest.Digest(ref[at+1:]))
			}

			client := r.source(registry.Platform{}).(*registry.Client)
			r.requests.Store(0)
			rel, err := release.Expand(context.Background(), registry.StoreFirst{Client: client, Store: store}, p.Release)
			if err != nil {
				t.Fatal(err)
			}
			if n := r.requests.Load(); n != 0 {
				t.Fatalf("%d registry requests for a seeded release", n)
			}
			if rel.Version != "4.20.2" || rel.Multi != multi || len(rel.Components) != 5 {
				t.Fatalf("%+v", rel)
			}

			// Not seeded: the same call reads the registry.
			if _, err := release.Expand(context.Background(), registry.StoreFirst{Client: client, Store: mapStore{}}, p.Release); err != nil {
				t.Fatal(err)
			}
			if r.requests.Load() == 0 {
				t.Fatal("an empty store asked no registry")
			}
		})
	}
}
