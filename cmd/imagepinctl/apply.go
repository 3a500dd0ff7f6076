package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"

	"github.com/imagepin/imagepin/cmd/internal/wire"
	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/internal/fsutil"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/state"
	"github.com/imagepin/imagepin/status"
)

// apply runs imagepind's flow once in the foreground: the given files are the sets
// directory, the pins go to the same managed drop-in, and it returns when every set
// that applies to this node is Ready (0), or when one Failed or the timeout passed (1).
type applyOptions struct {
	timeout  time.Duration
	reload   string
	stateDir string
}

func newApply(g *globals) *cobra.Command {
	o := &applyOptions{}
	cmd := &cobra.Command{
		Use:   "apply FILE...",
		Short: "Pin and pull sets once, in the foreground (crictl-style local testing)",
		Long: `Run imagepind's flow once in the foreground with the given files as the sets directory:
select the sets for this node, check the disk, write the pins into CRI-O's managed
drop-in, reload CRI-O and confirm the pins, pull through the CRI socket, and print the
status. It refuses while imagepind runs on this node (they share the managed drop-in).
It keeps its own state (a temporary directory unless --state-dir), adds pins and never
removes one, and does not write imagepind's status file.

Exit 0 when every set that applies to this node is Ready, 1 when one failed, --timeout
passed, a file has an error or no set applies to this node (nothing done), 2 on a usage or
operational error.`,
		Example: `  imagepinctl apply set.yaml
  imagepinctl apply --config ./imagepind.toml --reload signal --timeout 10m sets/*.yaml`,
		GroupID:           "node",
		Args:              files,
		ValidArgsFunction: setFileArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.reload != "" && o.reload != "auto" && o.reload != "systemd" && o.reload != "signal" {
				return fail(exitUsage, "--reload %s: want auto, systemd or signal", o.reload)
			}
			cfg, err := g.loadConfig(cmd)
			if err != nil {
				return fail(exitUsage, "%v", err)
			}
			return exit(apply(cmd.Context(), cfg, o, args, cmd.OutOrStdout(), cmd.ErrOrStderr()))
		},
	}
	cmd.Flags().DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up after this long")
	cmd.Flags().StringVar(&o.reload, "reload", "", "override [crio] reload: auto, systemd or signal")
	cmd.Flags().StringVar(&o.stateDir, "state-dir", "", "apply's own state directory, kept between runs (default: a temporary one; never imagepind's)")
	_ = cmd.MarkFlagDirname("state-dir")
	_ = cmd.RegisterFlagCompletionFunc("reload", cobra.FixedCompletions([]string{"auto", "systemd", "signal"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func apply(ctx context.Context, cfg conf.Config, o *applyOptions, files []string, stdout, stderr io.Writer) int {
	if o.reload != "" {
		cfg.CRIO.Reload = o.reload
	}
	// imagepind's state directory is only locked, so that apply refuses while imagepind
	// runs; apply keeps its own state (last good files, pin times, release cache) apart,
	// and never writes imagepind's status file.
	daemon, err := state.Open(cfg.StateDir)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitUsage
	}
	unlock, err := daemon.Lock()
	if err != nil {
		fmt.Fprintf(stderr, "imagepinctl apply: %v\n", err)
		return exitUsage
	}
	defer unlock()
	stateDir := o.stateDir
	if stateDir == "" {
		if stateDir, err = os.MkdirTemp("", "imagepinctl-apply-state-"); err != nil {
			fmt.Fprintln(stderr, err)
			return exitUsage
		}
		defer os.RemoveAll(stateDir)
	}
	store, err := state.Open(stateDir)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitUsage
	}
	// apply adds pins and never removes one: the managed drop-in may hold imagepind's
	// pins, which only imagepind (at its next start) decides to release.
	cfg.UnpinDelay = conf.Duration(100 * 365 * 24 * time.Hour)

	setsDir, err := os.MkdirTemp("", "imagepinctl-apply-")
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitUsage
	}
	defer os.RemoveAll(setsDir)
	for _, f := range files {
		data, err := fsutil.ReadRegular(f, pinset.MaxSetFileSize)
		if err != nil {
			fmt.Fprintf(stdout, "%s: %v\n", f, err)
			return exitNo
		}
		if _, err := pinset.ParseSetFile(f, data); err != nil {
			fmt.Fprintln(stdout, err)
			return exitNo
		}
		if err := os.WriteFile(filepath.Join(setsDir, filepath.Base(f)), data, 0o600); err != nil {
			fmt.Fprintln(stderr, err)
			return exitUsage
		}
	}
	log := logrus.New()
	log.SetOutput(stderr)
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var final status.Node
	done := errors.New("done")
	runCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	built, err := wire.Agent(cfg, store, wire.Options{
		Version: version,
		SetsDir: setsDir,
		// A runtime that does not answer within 2 s cannot pull for apply either.
		DetectFor: 2 * time.Second,
		Publish: func(n status.Node) {
			final = n
			fmt.Fprintf(stderr, "%s\n", n.Summary())
			settled := len(n.FileErrors) == 0
			for _, s := range n.Sets {
				settled = settled && (s.Phase == status.Ready || s.Phase == status.Failed)
			}
			if settled {
				stop(done)
			}
		},
		Log: log,
	})
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitUsage
	}
	defer built.Client.Close()
	_ = built.Agent.Run(runCtx, nil)
	printStatus(stdout, final, false)
	if !errors.Is(context.Cause(runCtx), done) {
		fmt.Fprintf(stderr, "imagepinctl apply: gave up: %v\n", context.Cause(runCtx))
		return exitNo
	}
	if len(final.Sets) == 0 {
		fmt.Fprintf(stderr, "imagepinctl apply: no set in %s selects node %s: nothing was done\n", strings.Join(files, ", "), final.Node.Name)
		return exitNo
	}
	return nodeExit(final)
}
