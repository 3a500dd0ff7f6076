package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/release"
	"github.com/imagepin/imagepin/release/releasetest"
)

// releaseCost measures expanding a release of n components: cold (from the registry)
// and from state (a new process with the same state directory), single-arch and multi.
func (b *bench) releaseCost(ctx context.Context, n int) error {
	host, requests, stop := countingProxy(b.reg.Host)
	defer stop()
	dir := filepath.Join(b.dir, "release-cost")
	os.MkdirAll(filepath.Join(dir, "registries.conf.d"), 0o755)
	regConf := filepath.Join(dir, "registries.conf")
	os.WriteFile(regConf, []byte(fmt.Sprintf("[[registry]]\nlocation = %q\ninsecure = true\n", host)), 0o644)
	resolver := registry.New(registry.Config{RegistriesConf: regConf, RegistriesConfDir: filepath.Join(dir, "registries.conf.d"),
		CertsDir: filepath.Join(dir, "certs.d"), Platform: registry.Platform{OS: "linux", Architecture: "amd64"}}, nil)
	fmt.Printf("## Release expansion: %d components + 4 OS images, registry on loopback\n\nRegistry requests counted by a proxy.\n\n| payload | expansion | time | registry requests |\n|---|---|---|---|\n", n)
	for _, multi := range []bool{false, true} {
		kind := "single-arch"
		if multi {
			kind = "multi (manifest lists)"
		}
		start := time.Now()
		p, err := releasetest.Push(ctx, releasetest.Options{PushHost: b.reg.Host, RefHost: host, Repo: fmt.Sprintf("ocp/release-%v", multi),
			Version: "4.20.1", Components: n, Multi: multi})
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "  pushed a %s release of %d components in %s\n", kind, n, time.Since(start).Round(time.Millisecond))
		state := filepath.Join(dir, fmt.Sprintf("state-%v", multi))
		for _, how := range []string{"cold", "from state (new process, same state_dir)"} {
			requests.Store(0)
			start := time.Now()
			rel, err := (&release.Cached{Dir: state, Source: resolver}).Expand(ctx, p.Release)
			if err != nil {
				return err
			}
			if len(rel.Components) != n {
				return fmt.Errorf("expanded %d components", len(rel.Components))
			}
			fmt.Printf("| %s | %s | %d ms | %d |\n", kind, how, time.Since(start).Milliseconds(), requests.Load())
		}
	}
	fmt.Println()
	return nil
}
