// Command imagepind is the node daemon: it pins and pre-loads the images of the
// PinnedImageSet files that apply to this node. See the README.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"

	"github.com/imagepin/imagepin/clustersync"
	"github.com/imagepin/imagepin/cmd/internal/wire"
	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/internal/idle"
	"github.com/imagepin/imagepin/nodegiveback"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/state"
	"github.com/imagepin/imagepin/systemd"
)

// version is set at build time (-ldflags -X main.version=...).
var version = "0.1.0-dev"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "uninstall" {
		os.Exit(uninstall(os.Args[2:], os.Stdout, os.Stderr))
	}
	configPath := flag.String("config", conf.DefaultConfigPath, "imagepind's TOML config file")
	logLevel := flag.String("log-level", "info", "log level: debug, info, warn, error")
	logFormat := flag.String("log-format", "text", "log format: text or json")
	showVersion := flag.Bool("version", false, "print the version and exit")
	var o conf.Overrides
	flag.StringVar(&o.NodeName, "node-name", "", "replaces [node] name (a DaemonSet: the pod's spec.nodeName)")
	flag.StringVar(&o.PeerHost, "peer-host", "", "replaces the host of [peers] address, keeping its port (a DaemonSet: the pod's status.hostIP)")
	flag.Parse()
	if *showVersion {
		fmt.Println(version)
		return
	}
	log := logrus.New()
	if lvl, err := logrus.ParseLevel(*logLevel); err == nil {
		log.SetLevel(lvl)
	}
	// Milliseconds: a pass, a reload and a pull are told apart in the log.
	const stamp = "2006-01-02T15:04:05.000Z07:00"
	log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: stamp})
	if *logFormat == "json" {
		log.SetFormatter(&logrus.JSONFormatter{TimestampFormat: stamp})
	}
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "config" })
	cfg, err := conf.LoadConfig(*configPath, explicit)
	if err == nil {
		cfg, err = cfg.Override(o)
	}
	if err != nil {
		log.WithError(err).Error("config")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// systemctl reload imagepind (SIGHUP): look at the node now. Caught from the start, so
	// a reload while imagepind starts never stops it.
	reload := make(chan os.Signal, 1)
	signal.Notify(reload, syscall.SIGHUP)
	if err := run(ctx, cfg, reload, log); err != nil {
		log.WithError(err).Error("imagepind stopped")
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg conf.Config, reload <-chan os.Signal, log *logrus.Logger) error {
	// The state directory (0700) and the sets directory (0755) are made where absent: a
	// fresh node's (a DaemonSet's new host path) works from the first start.
	store, err := state.Open(cfg.StateDir)
	if err != nil {
		return err
	}
	if made, err := pinset.MakeSetsDir(cfg.SetsDir); err != nil {
		return err
	} else if made {
		log.WithField("dir", cfg.SetsDir).Info("sets directory made")
	}
	unlock, err := store.Lock()
	if err != nil {
		return err
	}
	defer unlock()
	// imagepind runs on the node again: it is no longer given back.
	if err := nodegiveback.ForgetReceipt(cfg.StateDir); err != nil {
		return fmt.Errorf("remove the uninstall receipt: %w", err)
	}

	// Triggers of a reconcile: file changes, the cluster sync's faults and the tags'
	// report changing.
	triggers := make(chan struct{}, 1)
	poke := func() {
		select {
		case triggers <- struct{}{}:
		default:
		}
	}
	var syncer *clustersync.Syncer
	if cfg.Cluster.Kubeconfig != "" {
		if syncer, err = wire.ClusterSync(cfg, version, log, poke); err != nil {
			return err
		}
	}

	notifier := systemd.Notifier{}
	// Settled: give the memory of the last burst (parsing, sizing, pulls) back now,
	// not at the Go runtime's leisure, and the code pages it ran, so an idle node's
	// imagepind stays small; again after the work the agent does not see (the mirror
	// serving peers, a metrics scrape) once the process is quiet.
	trimmer := &idle.Trimmer{}
	peers, err := wire.NewPeers(cfg, cfg.StateDir, log)
	if err != nil {
		return err
	}
	m := wire.Metrics(peers)
	reporter := wire.Reporter(cfg, peers, poke, log)
	// The node condition PinnedImagesReady on this node's Node ([cluster] node_condition).
	condition, err := wire.NodeCondition(cfg, version, log)
	if err != nil {
		return err
	}
	opts := wire.Options{
		Peers:           peers,
		Tags:            true,
		TagsChanged:     poke,
		HoldingsChanged: poke,
		Version:         version,
		Publish:         wire.DaemonPublish(cfg, notifier.Status, m, reporter, condition, peers, log),
		Log:             log,
		Observer:        m,
		// WATCHDOG=1 only from the loop itself: a CRI-O outage slows no step for long
		// (every call has a timeout), so it cannot get imagepind killed.
		Alive:     notifier.Watchdog,
		Heartbeat: notifier.WatchdogInterval(),
		Idle:      trimmer.Settled,
	}
	if syncer != nil {
		opts.SourceFaults, opts.SourceSynced = syncer.Faults, syncer.Synced
	}
	if reporter != nil {
		opts.Holders = reporter
	}
	built, err := wire.Agent(cfg, store, opts)
	if err != nil {
		return err
	}
	defer built.Client.Close()
	a := built.Agent
	a.OnFirstReconcile(notifier.Ready)
	w := wire.Watch(cfg, log)
	log.WithField("config", fmt.Sprintf("sets_dir=%s state_dir=%s cri=%s reload=%s", cfg.SetsDir, cfg.StateDir, cfg.CRI.Endpoint, cfg.CRIO.Reload)).
		WithField("version", version).WithField("cluster", cfg.Cluster.Kubeconfig != "").Info("imagepind starting")

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return w.Run(ctx) })
	g.Go(func() error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-w.C():
				poke()
			}
		}
	})
	g.Go(func() error { return a.Run(ctx, triggers) })
	g.Go(func() error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-reload:
				a.LookNow()
			}
		}
	})
	g.Go(func() error { return trimmer.Run(ctx) })
	// The tags' check, their endpoint (CRI-O) and their keeper.
	g.Go(func() error { return built.Tags.Run(ctx) })
	if syncer != nil {
		// The API being down never stops imagepind: the sync keeps the files and retries.
		g.Go(func() error { return syncer.Run(ctx) })
	}
	if condition != nil {
		// The API being down never stops imagepind: the writer retries with the latest.
		g.Go(func() error { return condition.Run(ctx) })
	}
	if peers != nil {
		// The store's pruning, the runtime's mirror on loopback, the peers' server (its
		// failing is logged and leaves the node-local mirror running).
		g.Go(func() error { return peers.Run(ctx) })
		g.Go(func() error { return peers.Serve(ctx) })
		g.Go(func() error { return peers.ServePeers(ctx) })
	}
	if sw := wire.SeedWatch(cfg, peers, store, log); sw != nil {
		g.Go(func() error { return sw.Run(ctx) })
	}
	if cfg.Metrics.Address != "" {
		g.Go(func() error { return m.Serve(ctx, cfg.Metrics.Address) })
	}
	if reporter != nil {
		// The aggregator being down never stops imagepind: the reporter retries alone.
		g.Go(func() error {
			if err := reporter.Run(ctx); err != nil {
				log.WithError(err).Error("reporting to the aggregator is off")
			}
			return nil
		})
	}
	err = g.Wait()
	notifier.Stopping()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
