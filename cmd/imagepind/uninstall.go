package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/cmd/internal/wire"
	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/internal/fsutil"
	"github.com/imagepin/imagepin/nodegiveback"
	"github.com/imagepin/imagepin/state"
)

// Exit codes of imagepind uninstall.
const (
	uninstallOK = 0
	// uninstallNo: not given back (--status), or the uninstall failed; a later run
	// finishes it.
	uninstallNo = 1
	// uninstallUsage: a bad flag or config.
	uninstallUsage = 2
)

// uninstall is `imagepind uninstall`: it gives the node back as it was before imagepind
// first ran (package nodegiveback); --status says whether it is; --wait then stays until
// SIGTERM or SIGINT, touching nothing (the Helm chart's uninstall mode).
func uninstall(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("imagepind uninstall", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", conf.DefaultConfigPath, "imagepind's TOML config file")
	status := fs.Bool("status", false, "exit 0 and print what was restored when the node is given back, else exit 1")
	wait := fs.Bool("wait", false, "after giving the node back, wait for SIGTERM or SIGINT, then exit 0")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return uninstallUsage
	}
	log := logrus.New()
	log.SetOutput(stderr)
	if lvl, err := logrus.ParseLevel(*logLevel); err == nil {
		log.SetLevel(lvl)
	}
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "config" })
	cfg, err := conf.LoadConfig(*configPath, explicit)
	if err != nil {
		log.WithError(err).Error("config")
		return uninstallUsage
	}
	if *status {
		r, err := nodegiveback.ReadReceipt(cfg.StateDir)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return uninstallNo
		}
		fmt.Fprint(stdout, r.Text())
		return uninstallOK
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := giveBack(ctx, cfg, stdout, log); err != nil {
		log.WithError(err).Error("uninstall: the node is not given back yet; run it again")
		return uninstallNo
	}
	if *wait {
		<-ctx.Done()
	}
	return uninstallOK
}

func giveBack(ctx context.Context, cfg conf.Config, stdout io.Writer, log *logrus.Logger) error {
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	lock := filepath.Join(cfg.StateDir, state.LockFile)
	unlock, err := fsutil.TryLock(lock)
	if errors.Is(err, fsutil.ErrLocked) {
		return fmt.Errorf("imagepind (or imagepinctl apply) runs on this node, holding %s: stop it first", lock)
	}
	if err != nil {
		return fmt.Errorf("lock %s: %w", lock, err)
	}
	defer unlock()
	gc, deps, closeAll, err := wire.GiveBack(cfg, state.LockFile, log)
	if err != nil {
		return err
	}
	defer closeAll()
	r, err := nodegiveback.Run(ctx, gc, deps)
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, r.Text())
	return nil
}
