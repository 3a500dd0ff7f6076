// Command imagepin-aggregator collects every node's imagepind report and answers, per
// set, which nodes are ready, which fail and why. See the README.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"

	"github.com/imagepin/imagepin/aggregator"
	"github.com/imagepin/imagepin/internal/fsutil"
)

var version = "0.1.0-dev"

type options struct {
	grpcAddress, httpAddress  string
	tlsCert, tlsKey, clientCA string
	expectedNodes             string
	stateFile                 string
	flushInterval             time.Duration
	maxNodes, maxSets         int
}

func main() {
	var o options
	defineFlags(flag.CommandLine, &o)
	logLevel := flag.String("log-level", "info", "log level")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(version)
		return
	}
	log := logrus.New()
	if lvl, err := logrus.ParseLevel(*logLevel); err == nil {
		log.SetLevel(lvl)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.WithError(err).Error("imagepin-aggregator stopped")
		os.Exit(1)
	}
}

// defineFlags registers the flags (also used by the test that checks the manifests).
func defineFlags(fs *flag.FlagSet, o *options) {
	fs.StringVar(&o.grpcAddress, "grpc-address", ":9443", "report listener (gRPC, mTLS: node client certificates)")
	fs.StringVar(&o.httpAddress, "http-address", ":9444", "read listener (HTTP: /v1/sets, /v1/nodes, /metrics, /healthz; no client certificates)")
	fs.StringVar(&o.tlsCert, "tls-cert", "/etc/imagepin-aggregator/tls/tls.crt", "serving certificate of the report listener")
	fs.StringVar(&o.tlsKey, "tls-key", "/etc/imagepin-aggregator/tls/tls.key", "its key")
	fs.StringVar(&o.clientCA, "client-ca", "/etc/imagepin-aggregator/kubelet-client-ca/ca-bundle.crt", "CA of the nodes' client certificates (the kubelet client CA)")
	fs.StringVar(&o.expectedNodes, "expected-nodes", "", "optional file of node names, one a line: nodes that never reported count as Unknown")
	fs.StringVar(&o.stateFile, "state-file", "", "optional bbolt file keeping the last reports across restarts (heartbeats stay the truth)")
	fs.DurationVar(&o.flushInterval, "flush-interval", 5*time.Second, "how often changed reports are written to --state-file")
	fs.IntVar(&o.maxNodes, "max-nodes", aggregator.DefaultLimits().MaxNodes, "nodes the aggregator keeps at most")
	fs.IntVar(&o.maxSets, "max-sets-per-report", aggregator.DefaultLimits().MaxSetsPerReport, "sets one report may carry")
}

func run(ctx context.Context, o options, log *logrus.Logger) error {
	limits := aggregator.DefaultLimits()
	limits.MaxNodes, limits.MaxSetsPerReport = o.maxNodes, o.maxSets
	store := aggregator.NewStore(limits, time.Now)
	if o.expectedNodes != "" {
		data, err := fsutil.ReadRegular(o.expectedNodes, 16<<20)
		if err != nil {
			return fmt.Errorf("expected nodes: %w", err)
		}
		nodes := aggregator.ReadExpectedNodes(data)
		store.SetExpected(nodes)
		log.WithField("nodes", len(nodes)).Info("expected nodes")
	}
	var persister *aggregator.Persister
	if o.stateFile != "" {
		p, err := aggregator.OpenPersister(o.stateFile, store, o.flushInterval, log)
		if err != nil {
			return err
		}
		n, err := p.Load()
		if err != nil {
			log.WithError(err).Warn("state file partly read")
		}
		log.WithField("nodes", n).Info("reports restored from the state file")
		persister = p
	}
	tlsConfig, err := aggregator.ServerTLS(o.tlsCert, o.tlsKey, o.clientCA)
	if err != nil {
		return err
	}
	gl, err := net.Listen("tcp", o.grpcAddress)
	if err != nil {
		return err
	}
	hl, err := net.Listen("tcp", o.httpAddress)
	if err != nil {
		gl.Close()
		return err
	}
	log.WithField("grpc", gl.Addr().String()).WithField("http", hl.Addr().String()).WithField("version", version).Info("imagepin-aggregator listening")
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return aggregator.ServeGRPC(ctx, gl, tlsConfig, store, log) })
	g.Go(func() error { return aggregator.ServeHTTP(ctx, hl, store) })
	if persister != nil {
		g.Go(func() error { return persister.Run(ctx) })
	}
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
