package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/internal/fsutil"
	"github.com/imagepin/imagepin/internal/wire"
	"github.com/imagepin/imagepin/state"
	"github.com/imagepin/imagepin/status"
)

// apply runs imagepind's flow once in the foreground: the given files are the sets
// directory, the pins go to the same managed drop-in, and it returns when every set
// that applies to this node is Ready (0), or when one Failed or the timeout passed (1).
func apply(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("apply", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", conf.DefaultConfigPath, "imagepind's config")
	timeout := fs.Duration("timeout", 30*time.Minute, "give up after this long")
	reload := fs.String("reload", "", "override [crio] reload: auto, systemd or signal")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "usage: imagepinctl apply [--config FILE] FILE...")
		return 2
	}
	cfg, err := loadConfig(fs, *configPath)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if *reload != "" {
		cfg.CRIO.Reload = *reload
	}
	store, err := state.Open(cfg.StateDir)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	unlock, err := store.Lock()
	if err != nil {
		fmt.Fprintf(stderr, "imagepinctl apply: %v\n", err)
		return 2
	}
	defer unlock()

	setsDir, err := os.MkdirTemp("", "imagepinctl-apply-")
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	defer os.RemoveAll(setsDir)
	for _, f := range fs.Args() {
		data, err := fsutil.ReadRegular(f, conf.MaxSetFileSize)
		if err != nil {
			fmt.Fprintf(stdout, "%s: %v\n", f, err)
			return 1
		}
		if _, err := conf.ParseSetFile(f, data); err != nil {
			fmt.Fprintln(stdout, err)
			return 1
		}
		if err := os.WriteFile(filepath.Join(setsDir, filepath.Base(f)), data, 0o600); err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
	}
	log := logrus.New()
	log.SetOutput(stderr)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var final status.Node
	done := errors.New("done")
	runCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	a, client, err := wire.Agent(cfg, store, wire.Options{
		Version: version,
		SetsDir: setsDir,
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
		return 2
	}
	defer client.Close()
	_ = a.Run(runCtx, nil)
	if err := status.WriteFile(cfg.StatusFile, final); err != nil {
		fmt.Fprintf(stderr, "write status file: %v\n", err)
	}
	printStatus(stdout, final)
	if !errors.Is(context.Cause(runCtx), done) {
		fmt.Fprintf(stderr, "imagepinctl apply: gave up: %v\n", context.Cause(runCtx))
		return 1
	}
	for _, s := range final.Sets {
		if s.Phase != status.Ready {
			return 1
		}
	}
	if len(final.FileErrors) > 0 {
		return 1
	}
	return 0
}
