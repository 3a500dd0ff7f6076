package crio

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/pkg/sysregistriesv2"
	"go.podman.io/image/v5/types"
)

// The mirror drop-in follows the pins; a broken administrator's registries.conf is an
// error (the pinner makes it a fault) that writes no mirror drop-in; nothing is
// rewritten when nothing changed, and a drop-in removed behind imagepind's back comes
// back.
func TestMirrorRegistriesFollowsThePinsAndSurvivesABadRegistriesConf(t *testing.T) {
	dir := t.TempDir()
	regConf := filepath.Join(dir, "registries.conf")
	regDir := filepath.Join(dir, "registries.conf.d")
	os.MkdirAll(regDir, 0o755)
	os.WriteFile(regConf, []byte("[[registry]\nbroken"), 0o644)
	m := &MirrorRegistries{
		Local: "127.0.0.1:7443", Admin: &AdminFiles{Main: regConf, Dir: regDir, Scratch: filepath.Join(dir, "scratch")},
		Path: func(r string) string { return r },
	}
	ref := "quay.io/ns/app@sha256:" + strings.Repeat("1", 64)
	dropIn := filepath.Join(regDir, MirrorDropInName)

	changed, err := m.Render([]string{ref})
	if err == nil || changed || !strings.Contains(err.Error(), "registries.conf") || !strings.HasPrefix(err.Error(), "node-local mirror's registries drop-in: ") {
		t.Fatalf("broken registries.conf: %v %v", changed, err)
	}
	if _, err := os.Stat(dropIn); !os.IsNotExist(err) {
		t.Fatalf("a mirror drop-in was written over a broken registries.conf: %v", err)
	}

	os.WriteFile(regConf, []byte("unqualified-search-registries = []\n"), 0o644)
	if changed, err := m.Render([]string{ref}); err != nil || !changed {
		t.Fatalf("fixed registries.conf: %v %v", changed, err)
	}
	data, err := os.ReadFile(dropIn)
	if err != nil || !strings.Contains(string(data), `location = "127.0.0.1:7443/quay.io/ns/app"`) {
		t.Fatalf("drop-in %v:\n%s", err, data)
	}
	if changed, _ := m.Render([]string{ref}); changed {
		t.Fatal("an unchanged render changed something")
	}
	os.Remove(dropIn)
	if changed, _ := m.Render([]string{ref}); !changed {
		t.Fatal("a removed drop-in was not written again")
	}
	if changed, _ := m.Render(nil); !changed {
		t.Fatal("no pins left, yet the drop-in stays")
	}
	if _, err := os.Stat(dropIn); !os.IsNotExist(err) {
		t.Fatalf("drop-in with no pins: %v", err)
	}
}

// With the tag endpoint, containers/image (reading the drop-in as CRI-O does) asks it
// first for a tag, over TLS (not insecure), then the registry; a digest goes to the
// plain mirror first and never to the tag endpoint.
func TestMirrorRegistriesAsksTagsOfTheTLSEndpointOnly(t *testing.T) {
	dir := t.TempDir()
	regConf := filepath.Join(dir, "registries.conf")
	regDir := filepath.Join(dir, "registries.conf.d")
	os.MkdirAll(regDir, 0o755)
	os.WriteFile(regConf, []byte("unqualified-search-registries = []\n"), 0o644)
	m := &MirrorRegistries{Local: "127.0.0.1:7443", Tags: "127.0.0.1:7445",
		Admin: &AdminFiles{Main: regConf, Dir: regDir, Scratch: filepath.Join(dir, "scratch")}, Path: func(r string) string { return r }}
	d := "sha256:" + strings.Repeat("1", 64)
	if _, err := m.Render([]string{"quay.io/ns/app@" + d}); err != nil {
		t.Fatal(err)
	}
	sys := &types.SystemContext{SystemRegistriesConfPath: regConf, SystemRegistriesConfDirPath: regDir}
	sysregistriesv2.InvalidateCache()
	reg, err := sysregistriesv2.FindRegistry(sys, "quay.io/ns/app")
	if err != nil || reg == nil {
		t.Fatalf("find registry: %v %v", reg, err)
	}
	sources := func(ref string) []string {
		named, err := reference.ParseNormalizedNamed(ref)
		if err != nil {
			t.Fatal(err)
		}
		ps, err := reg.PullSourcesFromReference(named)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range ps {
			out = append(out, fmt.Sprintf("%s insecure=%v", p.Reference, p.Endpoint.Insecure))
		}
		return out
	}
	tagged := sources("quay.io/ns/app:v1")
	if want := []string{"127.0.0.1:7445/quay.io/ns/app:v1 insecure=false", "quay.io/ns/app:v1 insecure=false"}; !slices.Equal(tagged, want) {
		t.Fatalf("a tag is asked of %v, want %v", tagged, want)
	}
	digested := sources("quay.io/ns/app@" + d)
	if want := []string{"127.0.0.1:7443/quay.io/ns/app@" + d + " insecure=true", "quay.io/ns/app@" + d + " insecure=false"}; !slices.Equal(digested, want) {
		t.Fatalf("a digest is asked of %v, want %v", digested, want)
	}
}

// CRI-O skips TLS verification on every endpoint of a pull whose registry it holds
// insecure: those repositories get no tag endpoint.
func TestVerifiesTLSAsCRIODecides(t *testing.T) {
	ctx := t.Context()
	for _, c := range []struct {
		registry string
		insecure []string
		want     bool
	}{
		{"src.example.invalid", nil, true},
		{"127.0.0.1:5000", nil, false},
		{"127.0.0.5", nil, false},
		{"localhost:5000", nil, false},
		{"quay.io", []string{"quay.io"}, false},
		{"reg.example.invalid:5000", []string{"reg.example.invalid:5000"}, false},
		{"10.1.2.3:5000", []string{"10.0.0.0/8"}, false},
		{"10.1.2.3:5000", []string{"192.168.0.0/16"}, true},
	} {
		if got := VerifiesTLS(ctx, c.registry, c.insecure); got != c.want {
			t.Errorf("%s with insecure %v: %v, want %v", c.registry, c.insecure, got, c.want)
		}
	}
	dir := t.TempDir()
	regConf := filepath.Join(dir, "registries.conf")
	regDir := filepath.Join(dir, "registries.conf.d")
	os.MkdirAll(regDir, 0o755)
	os.WriteFile(regConf, []byte("unqualified-search-registries = []\n"), 0o644)
	m := &MirrorRegistries{Local: "127.0.0.1:7443", Tags: "127.0.0.1:7445",
		Insecure: func(context.Context) ([]string, error) { return []string{"10.0.0.0/8"}, nil },
		Admin:    &AdminFiles{Main: regConf, Dir: regDir, Scratch: filepath.Join(dir, "scratch")}, Path: func(r string) string { return r }}
	d := "@sha256:" + strings.Repeat("1", 64)
	if _, err := m.Render([]string{"src.example.invalid/a" + d, "127.0.0.1:5000/b" + d, "10.0.0.1:5000/c" + d}); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(filepath.Join(regDir, MirrorDropInName))
	if n := strings.Count(string(data), "127.0.0.1:7445/"); n != 1 || !strings.Contains(string(data), "127.0.0.1:7445/src.example.invalid/a") {
		t.Fatalf("the tag endpoint for %d repositories, want src.example.invalid/a alone:\n%s", n, data)
	}
}

// From CRI-O 1.35 each endpoint of a pull is verified as registries.conf says of it
// (insecure_registries and the implicit 127.0.0.0/8 are gone): every repository gets the
// tag endpoint, whose entry is never insecure. A CRI-O before 1.35 keeps the rule above;
// a version that cannot be read gives no repository the endpoint, and is asked again at
// the next render.
func TestTagEndpointByCRIOVersion(t *testing.T) {
	d := "@sha256:" + strings.Repeat("1", 64)
	patterns := []string{"src.example.invalid/a" + d, "127.0.0.1:5000/b" + d, "10.0.0.1:5000/c" + d}
	for _, c := range []struct {
		version string
		err     error
		want    int
	}{
		{"1.36.3", nil, 3},
		{"1.35.0", nil, 3},
		{"1.34.11", nil, 1},
		{"", errors.New("connection refused"), 0},
	} {
		t.Run(c.version, func(t *testing.T) {
			dir := t.TempDir()
			regConf := filepath.Join(dir, "registries.conf")
			regDir := filepath.Join(dir, "registries.conf.d")
			os.MkdirAll(regDir, 0o755)
			os.WriteFile(regConf, []byte("unqualified-search-registries = []\n"), 0o644)
			asked := 0
			m := &MirrorRegistries{Local: "127.0.0.1:7443", Tags: "127.0.0.1:7445",
				Version:  func(context.Context) (string, error) { asked++; return c.version, c.err },
				Insecure: func(context.Context) ([]string, error) { return []string{"10.0.0.0/8"}, nil },
				Admin:    &AdminFiles{Main: regConf, Dir: regDir, Scratch: filepath.Join(dir, "scratch")}, Path: func(r string) string { return r }}
			if _, err := m.Render(patterns); err != nil {
				t.Fatal(err)
			}
			data, _ := os.ReadFile(filepath.Join(regDir, MirrorDropInName))
			if n := strings.Count(string(data), "127.0.0.1:7445/"); n != c.want {
				t.Fatalf("CRI-O %q: the tag endpoint for %d repositories, want %d:\n%s", c.version, n, c.want, data)
			}
			if strings.Contains(string(data), "127.0.0.1:7445/") && !strings.Contains(string(data), "127.0.0.1:7445/src.example.invalid/a") {
				t.Fatalf("no tag endpoint for the TLS source:\n%s", data)
			}
			m.Render(patterns)
			if c.err != nil && asked != 2 {
				t.Fatalf("version asked %d times after a failure, want again at the next render", asked)
			}
		})
	}
}
