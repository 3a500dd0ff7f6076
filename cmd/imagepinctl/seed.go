package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/cmd/internal/wire"
	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/internal/bytesize"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/seed"
	"github.com/imagepin/imagepin/state"
)

type seedOptions struct {
	list, remove bool
	names        seed.Names
}

func newSeed(g *globals) *cobra.Command {
	o := &seedOptions{}
	cmd := &cobra.Command{
		Use:   "seed PATH... | --list | --remove PATH|ID...",
		Short: "Import images from offline media into the node's blob store",
		Long: `Import the images of offline media into the blob store imagepind's node-local mirror
serves from ([peers] store_dir), and record each import (a seed) under the state
directory (<state_dir>/seeds/<id>.json). Media: an OCI image layout (skopeo copy
--preserve-digests to oci: and oci-archive:, podman save --format oci-archive, crane pull
--format oci, oras) or a
registry's storage (docker/registry/v2, as oc-mirror's mirror_NNNNNN.tar archives carry
it), each as a directory or a tar; a directory of oc-mirror's archives is one medium.

Every manifest and blob is checked against its digest; a bad medium is refused and
nothing of it is stored; a seed cut short resumes when run again; seeding the same
medium twice writes nothing. imagepind's prune keeps what a seed holds until
--remove. Seeding pins nothing: a set naming seeded images by digest is sized from the
store and served to the runtime and to peers from it, with no registry. A seeded image
under a name the sets pin with another digest (a copy that converted it) is a warning.
--list shows, too, the media of [seed] directory imagepind did not seed for a fault of
theirs (refused, unreadable), naming each file.

Exit codes: 0 seeded (or listed, removed), 1 a bad medium, not enough free space, or no
such seed, 2 a usage or operational error.`,
		Example: `  imagepinctl seed /mnt/usb/app.oci.tar
  imagepinctl seed --repository quay.io/ns/app /mnt/usb/app-layout     # names in the layout are tags only
  imagepinctl seed --registry quay.io /mnt/usb/oc-mirror                # mirror_000001.tar, mirror_000002.tar...
  imagepinctl seed --list
  imagepinctl seed --remove 3f9a0c1d`,
		GroupID: "node",
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case o.list && (o.remove || len(args) > 0):
				return fmt.Errorf("--list takes no PATH and no --remove: usage: %s", cmd.UseLine())
			case !o.list && len(args) == 0:
				return fmt.Errorf("no PATH given: usage: %s", cmd.UseLine())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := g.loadConfig(cmd)
			if err != nil {
				return fail(exitUsage, "%v", err)
			}
			return runSeed(cmd.Context(), cfg, o, args, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.list, "list", false, "list the seeds of this node")
	f.BoolVar(&o.remove, "remove", false, "remove the seeds given by id or by medium path, and their blobs no other seed and no pin needs")
	f.StringVar(&o.names.Repository, "repository", "", "the repository of an OCI layout's images named by a tag alone (quay.io/ns/app)")
	f.StringVar(&o.names.Registry, "registry", "", "the registry host a registry storage's repositories came from (quay.io)")
	return cmd
}

func runSeed(ctx context.Context, cfg conf.Config, o *seedOptions, args []string, stdout, stderr io.Writer) error {
	storeDir := wire.StoreDir(cfg, cfg.StateDir)
	if !o.list && !o.remove && !cfg.Peers.Enabled {
		return fail(exitUsage, "[peers] is off in the config: imagepind removes the blob store of a node without its node-local mirror (set [peers] enabled = true first)")
	}
	store, err := blobstore.Open(storeDir)
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	last := ""
	s := seed.New(seed.Config{Dir: seed.Dir(cfg.StateDir), StoreDir: storeDir, Names: o.names}, seed.Deps{
		Store: store,
		Progress: func(p seed.Progress) {
			fmt.Fprintf(stderr, "%s: %s of %s, %s/s, %s left\n", last, bytesText(p.Done), bytesText(p.Total),
				bytesText(int64(p.Rate)), p.ETA.Round(time.Second))
		},
	})
	switch {
	case o.list:
		return listSeeds(ctx, s, cfg, stdout)
	case o.remove:
		return removeSeeds(ctx, s, cfg.StateDir, args, stdout)
	}
	code := exitOK
	seeded := false
	for _, p := range args {
		last = p
		sum, err := s.Seed(ctx, p)
		if err != nil {
			fmt.Fprintf(stderr, "imagepinctl seed: %v\n", err)
			code = max(code, seedExit(err))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		printSummary(stdout, p, sum)
		seeded = true
	}
	if seeded {
		warnMismatches(cfg, stderr, "imagepinctl seed: warning: ")
	}
	return exit(code)
}

// warnMismatches says which images the sets pin under a name the seeds hold with
// another digest (seed.Mismatches): the medium does not carry what is pinned.
func warnMismatches(cfg conf.Config, w io.Writer, prefix string) {
	recs, err := seed.Records(seed.Dir(cfg.StateDir))
	if err != nil {
		fmt.Fprintf(w, "%sthe seeds are not compared with the sets: %v\n", prefix, err)
		return
	}
	pinned, err := pinnedRefs(cfg)
	if err != nil {
		fmt.Fprintf(w, "%sthe seeds are compared with part of the sets only: %v\n", prefix, err)
	}
	for _, m := range seed.Mismatches(recs, pinned) {
		fmt.Fprintf(w, "%s%s\n", prefix, m)
	}
}

// pinnedRefs are the references the sets in the sets directory name (whichever nodes
// they target, the cluster sync's too), with their tags, and the pins imagepind keeps:
// what a seed is meant to carry. It reads what it can, and says what it could not.
func pinnedRefs(cfg conf.Config) ([]string, error) {
	var out []string
	var errs []error
	files, err := pinset.ReadSetsDir(cfg.SetsDir, false)
	if err != nil {
		errs = append(errs, err)
	}
	for _, f := range files {
		if f.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.Name, f.Err))
			continue
		}
		res, err := pinset.ParseSetFile(f.Name, f.Data)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, st := range res.Sets {
			out = append(out, st.Images...)
			for _, t := range st.Tags {
				out = append(out, t.Name+"@"+t.Digest())
			}
		}
	}
	if _, err := os.Stat(cfg.StateDir); err == nil {
		st, err := state.Open(cfg.StateDir)
		if err == nil {
			var data state.Data
			if data, err = st.Load(); err == nil {
				for p := range data.Pins {
					out = append(out, p)
				}
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("the pins imagepind keeps: %w", err))
		}
	}
	return out, errors.Join(errs...)
}

func seedExit(err error) int {
	if errors.Is(err, seed.ErrBadMedia) || errors.Is(err, seed.ErrNoSpace) || errors.Is(err, seed.ErrNoSeed) {
		return exitNo
	}
	return exitUsage
}

func bytesText(n int64) string { return bytesize.Human(uint64(max(n, 0))) }

func printSummary(w io.Writer, path string, s *seed.Summary) {
	fmt.Fprintf(w, "%s (%s): seed %s: %d images, %d repositories, %d tags; %d manifests and blobs, %s\n",
		path, s.Format, s.ID, len(s.Images), s.Repositories, s.Tags, s.Manifests+s.Blobs, bytesText(s.Bytes))
	switch {
	case s.Written == 0 && !s.Recorded:
		fmt.Fprintf(w, "  already present: all of it; nothing written\n")
	default:
		fmt.Fprintf(w, "  written: %s", bytesText(s.Written))
		if s.Resumed > 0 {
			fmt.Fprintf(w, " (and %s an interrupted seed had written)", bytesText(s.Resumed))
		}
		fmt.Fprintf(w, "; already present: %d manifests and blobs, %s\n", s.PresentN, bytesText(s.Present))
	}
	images := append([]seed.Image(nil), s.Images...)
	sort.Slice(images, func(i, j int) bool { return images[i].Ref() < images[j].Ref() })
	for _, i := range images {
		note := ""
		switch {
		case i.MediaName == "":
			note = "  (no name in the medium: by digest)"
		case i.Repository == "":
			note = "  (no registry in the medium's name: --repository or --registry)"
		}
		fmt.Fprintf(w, "  %s%s\n", i.Ref(), note)
	}
}

func listSeeds(ctx context.Context, s *seed.Seeder, cfg conf.Config, w io.Writer) error {
	list, err := s.List(ctx)
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	listMediaFaults(cfg, w)
	if len(list) == 0 {
		fmt.Fprintln(w, "no seeds")
		return nil
	}
	defer warnMismatches(cfg, w, "warning: ")
	for _, st := range list {
		state := "complete"
		switch {
		case !st.Complete:
			state = "incomplete (cut short: seed its medium again, or --remove it)"
		case st.Missing > 0:
			state = fmt.Sprintf("%d manifests and blobs missing from the store", st.Missing)
		}
		fmt.Fprintf(w, "%s  %d images, %d manifests and blobs, %s  %s\n", st.ID, len(st.Images),
			len(st.Manifests)+len(st.Blobs), bytesText(st.Bytes), state)
		for _, m := range st.Media {
			fmt.Fprintf(w, "  from %s (%s, %s) %s\n", m.Path, m.Format, m.Kind, m.SeededAt.Format(time.RFC3339))
		}
		for _, i := range st.Images {
			fmt.Fprintf(w, "  %s\n", i.Ref())
		}
	}
	return nil
}

// listMediaFaults shows the media of the watched seed directory that imagepind did not
// seed for a fault of theirs (refused, unreadable), as it last found them.
func listMediaFaults(cfg conf.Config, w io.Writer) {
	mf, err := seed.ReadMediaFaults(seed.Dir(cfg.StateDir))
	switch {
	case err != nil:
		fmt.Fprintf(w, "the seed directory's faults cannot be read: %v\n", err)
		return
	case mf == nil || len(mf.Media) == 0 || cfg.Seed.Directory == "" || mf.Directory != filepath.Clean(cfg.Seed.Directory):
		return
	}
	media := fmt.Sprintf("%d media", len(mf.Media))
	if len(mf.Media) == 1 {
		media = "1 medium"
	}
	fmt.Fprintf(w, "seed directory %s: %s not seeded (as imagepind found them at %s):\n", mf.Directory,
		media, mf.Updated.Local().Format(time.DateTime))
	for _, f := range mf.Media {
		fmt.Fprintf(w, "  %s: %s\n", f.Path, f.Fault)
	}
}

func removeSeeds(ctx context.Context, s *seed.Seeder, stateDir string, args []string, w io.Writer) error {
	var pinned []string
	if _, err := os.Stat(stateDir); err == nil {
		st, err := state.Open(stateDir)
		if err != nil {
			return fail(exitUsage, "%v", err)
		}
		data, err := st.Load()
		if err != nil {
			return fail(exitUsage, "the pins imagepind keeps: %v", err)
		}
		for p := range data.Pins {
			pinned = append(pinned, p)
		}
	}
	for _, a := range args {
		r, err := s.Remove(ctx, a, pinned)
		if err != nil {
			return fail(seedExit(err), "%v", err)
		}
		fmt.Fprintf(w, "removed seed %s: %d manifests and blobs, %s (%d kept: another seed's or a pin's)\n", r.ID, r.Blobs, bytesText(r.Bytes), r.Kept)
	}
	return nil
}
