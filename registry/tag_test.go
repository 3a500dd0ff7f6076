package registry

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/imagepin/imagepin/test/registrytest"
)

// A tag resolves to its manifest's digest (a list's for a list, with its platforms);
// no tag is :latest; a tag the registry lacks is unavailable, its text kept.
func TestResolveTag(t *testing.T) {
	reg := registrytest.New(t, nil)
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	single := reg.Push("t/app", image(t, layer(t, 100)), "", "1.0", "latest")
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: image(t, layer(t, 10)), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: image(t, layer(t, 20)), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	multi := reg.PushIndex("t/multi", idx, "", "2.0")
	r := resolver(f, Platform{}, nil)
	ctx := context.Background()
	for _, ref := range []string{reg.Host + "/t/app:1.0", reg.Host + "/t/app"} {
		tag, err := r.ResolveTag(ctx, ref)
		if err != nil || tag.Digest.String() != strings.SplitN(single, "@", 2)[1] || tag.List {
			t.Fatalf("%s: %+v %v", ref, tag, err)
		}
	}
	tag, err := r.ResolveTag(ctx, reg.Host+"/t/multi:2.0")
	if err != nil || tag.Digest.String() != strings.SplitN(multi, "@", 2)[1] || !tag.List ||
		strings.Join(tag.Platforms, ",") != "linux/arm64,linux/amd64" {
		t.Fatalf("list: %+v %v", tag, err)
	}
	_, err = r.ResolveTag(ctx, reg.Host+"/t/app:9.9")
	if !IsUnavailable(err) || !strings.Contains(err.Error(), "manifest unknown") || !strings.Contains(err.Error(), reg.Host+"/t/app") {
		t.Fatalf("missing tag: %v", err)
	}
	if _, err := r.ResolveTag(ctx, "busybox"); err == nil || !strings.HasPrefix(err.Error(), "busybox: ") {
		t.Fatalf("short name: %v", err)
	}
}

// A registry that accepts connections and never answers fails ResolveTag after the
// Client's Timeout, saying so.
func TestResolveTagTimesOut(t *testing.T) {
	l := silentListener(t)
	f := newFiles(t, "")
	r := New(Config{RegistriesConf: f.Conf, RegistriesConfDir: f.ConfDir, CertsDir: f.Certs,
		Platform: Platform{OS: "linux", Architecture: "amd64"}, Timeout: 200 * time.Millisecond}, nil)
	_, err := r.ResolveTag(context.Background(), l.Addr().String()+"/x/stalled:1")
	if err == nil || !strings.Contains(err.Error(), "no answer from its registry within 200ms") {
		t.Fatalf("tag: %v", err)
	}
}
