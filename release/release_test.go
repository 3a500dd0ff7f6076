package release_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"

	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/release"
	"github.com/imagepin/imagepin/release/releasetest"
)

type reg struct {
	host     string
	requests atomic.Int64
	conf     string
	dir      string
}

// newReg is an in-process registry (plain HTTP) plus a registries.conf in which
// upstream.example.invalid/ocp exists only as a digest mirror of it.
func newReg(t *testing.T) *reg {
	r := &reg{dir: t.TempDir()}
	h := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.requests.Add(1)
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.host = strings.TrimPrefix(srv.URL, "http://")
	r.conf = filepath.Join(r.dir, "registries.conf")
	os.WriteFile(r.conf, []byte(fmt.Sprintf(`[[registry]]
location = %[1]q
insecure = true
[[registry]]
prefix = "upstream.example.invalid/ocp"
location = "upstream.example.invalid/ocp"
[[registry.mirror]]
location = "%[1]s/ocp"
insecure = true
pull-from-mirror = "digest-only"
`, r.host)), 0o644)
	return r
}

func (r *reg) source(p registry.Platform) release.Source {
	if p.OS == "" {
		p = registry.Platform{OS: "linux", Architecture: "amd64"}
	}
	return registry.New(registry.Config{RegistriesConf: r.conf, RegistriesConfDir: filepath.Join(r.dir, "none"),
		CertsDir: filepath.Join(r.dir, "certs"), Platform: p}, nil)
}

func (r *reg) push(t *testing.T, o releasetest.Options) releasetest.Payload {
	t.Helper()
	o.PushHost, o.RefHost, o.Repo = r.host, "upstream.example.invalid", "ocp/release"
	p, err := releasetest.Push(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func values(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

func TestExpandThroughMirrorOnlySource(t *testing.T) {
	for _, multi := range []bool{false, true} {
		t.Run(fmt.Sprintf("multi=%v", multi), func(t *testing.T) {
			r := newReg(t)
			p := r.push(t, releasetest.Options{Version: "4.20.1", Components: 5, Multi: multi})
			rel, err := release.Expand(context.Background(), r.source(registry.Platform{}), p.Release)
			if err != nil {
				t.Fatal(err)
			}
			if rel.Version != "4.20.1" || rel.Multi != multi || len(rel.Components) != 5 || rel.DefaultStream != "rhel-9" ||
				!slices.Equal(rel.StreamNames(), []string{"rhel-10", "rhel-9"}) {
				t.Fatalf("%+v", rel)
			}
			if rel.Streams["rhel-10"]["rhel-coreos-10-extensions"] != p.OS["rhel-coreos-10-extensions"] {
				t.Fatalf("streams %+v", rel.Streams)
			}
			worker, _ := rel.Images(false, "")
			want := append(values(p.Components), p.OS["rhel-coreos"], p.OS["rhel-coreos-extensions"])
			slices.Sort(want)
			if !slices.Equal(worker, want) {
				t.Fatalf("worker images\n%v\nwant\n%v", worker, want)
			}
			master, _ := rel.Images(true, "rhel-10")
			if len(master) != 8 || !slices.Contains(master, p.Release) || !slices.Contains(master, p.OS["rhel-coreos-10"]) || slices.Contains(master, p.OS["rhel-coreos"]) {
				t.Fatalf("master rhel-10 images %v", master)
			}
			if _, err := rel.Images(false, "rhel-8"); err == nil || !strings.Contains(err.Error(), `no OS image stream "rhel-8"; it has rhel-10, rhel-9`) {
				t.Fatalf("unknown stream: %v", err)
			}
			// The multi payload is read for another platform just as well; list digests stay.
			if multi {
				arm, err := release.Expand(context.Background(), r.source(registry.Platform{OS: "linux", Architecture: "arm64"}), p.Release)
				if err != nil || !slices.Equal(values(arm.Components), values(rel.Components)) {
					t.Fatalf("arm64: %v", err)
				}
			}
		})
	}
}

func TestUnlabelledAndOKDStreams(t *testing.T) {
	r := newReg(t)
	p := r.push(t, releasetest.Options{Version: "4.20.2", Components: 2, Unlabelled: true})
	rel, err := release.Expand(context.Background(), r.source(registry.Platform{}), p.Release)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rel.StreamNames(), []string{"rhel-coreos", "rhel-coreos-10"}) || rel.DefaultStream != "rhel-coreos" ||
		len(rel.Streams["rhel-coreos"]) != 2 {
		t.Fatalf("unlabelled streams by tag pair: %+v", rel.Streams)
	}
	okd := r.push(t, releasetest.Options{Version: "4.20.0-okd-scos.1", Components: 2, OKD: true})
	rel, err = release.Expand(context.Background(), r.source(registry.Platform{}), okd.Release)
	if err != nil || rel.DefaultStream != "centos-10" || len(rel.StreamNames()) != 1 {
		t.Fatalf("OKD: %+v %v", rel, err)
	}
}

func TestClearErrors(t *testing.T) {
	r := newReg(t)
	p := r.push(t, releasetest.Options{Version: "4.20.1", Components: 1})
	src := r.source(registry.Platform{})
	ctx := context.Background()
	// Not a release: a component.
	_, err := release.Expand(ctx, src, values(p.Components)[0])
	if !errors.Is(err, release.ErrNotRelease) || !strings.Contains(err.Error(), "no release-manifests/image-references") {
		t.Fatalf("not a release: %v", err)
	}
	// A tag instead of a digest.
	if _, err := release.Expand(ctx, src, "upstream.example.invalid/ocp/release:4.20.1"); err == nil || !strings.Contains(err.Error(), "is not by digest") {
		t.Fatalf("tag: %v", err)
	}
	// Unreachable: every endpoint tried is named.
	missing := "upstream.example.invalid/ocp/release@sha256:" + strings.Repeat("0", 64)
	_, err = release.Expand(ctx, src, missing)
	if err == nil || !strings.Contains(err.Error(), r.host+"/ocp/release") || !strings.Contains(err.Error(), "upstream.example.invalid/ocp/release") {
		t.Fatalf("unreachable: %v", err)
	}
}

func TestCachedExpansionNeedsNoRegistry(t *testing.T) {
	r := newReg(t)
	p := r.push(t, releasetest.Options{Version: "4.20.1", Components: 20})
	dir := t.TempDir()
	r.requests.Store(0)
	rel, err := (&release.Cached{Dir: dir, Source: r.source(registry.Platform{})}).Expand(context.Background(), p.Release)
	if err != nil {
		t.Fatal(err)
	}
	cold := r.requests.Load()
	// A new process (new cache object) with the same state directory.
	again, err := (&release.Cached{Dir: dir, Source: r.source(registry.Platform{})}).Expand(context.Background(), p.Release)
	if err != nil || r.requests.Load() != cold || again.Version != rel.Version || len(again.Components) != 20 {
		t.Fatalf("from state: %d more requests, %v", r.requests.Load()-cold, err)
	}
	t.Logf("cold expansion of 20 components + 4 OS images: %d requests", cold)
}
