package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/diskcheck"
	"github.com/imagepin/imagepin/status"
)

func showStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", conf.DefaultConfigPath, "imagepind's config")
	output := fs.String("o", "table", "output: table or json")
	aggregatorURL := fs.String("aggregator", "", "the aggregator's read URL (http://host:9444): show the cluster view")
	watch := fs.Bool("watch", false, "with --aggregator: redraw until interrupted")
	interval := fs.Duration("interval", 2*time.Second, "with --watch: how often")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *aggregatorURL != "" {
		return clusterStatus(ctx, *aggregatorURL, *watch, *interval, *output, stdout, stderr)
	}
	cfg, err := loadConfig(fs, *configPath)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	n, err := status.ReadFile(cfg.StatusFile)
	if err != nil {
		fmt.Fprintf(stderr, "imagepinctl: read status: %v (is imagepind running?)\n", err)
		return 2
	}
	switch *output {
	case "json":
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(n); err != nil {
			return 2
		}
	case "table":
		printStatus(stdout, n)
	default:
		fmt.Fprintf(stderr, "imagepinctl: -o %s: want table or json\n", *output)
		return 2
	}
	for _, s := range n.Sets {
		if s.Phase != status.Ready {
			return 1
		}
	}
	return 0
}

func printStatus(w io.Writer, n status.Node) {
	fmt.Fprintf(w, "node %s (%s), %s %s, updated %s\n", n.Node.Name, n.Node.Architecture,
		n.Node.Runtime.Name, n.Node.Runtime.Version, n.Updated.Local().Format(time.DateTime))
	if len(n.Sets) == 0 {
		fmt.Fprintln(w, "no sets apply to this node")
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SET\tPHASE\tIMAGES\tREASON\tMESSAGE")
		for _, s := range n.Sets {
			reason, msg := "", ""
			if c := s.Condition(status.ConditionReady); c != nil {
				reason, msg = c.Reason, c.Message
			}
			fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s\t%s\n", s.Name, s.Phase, s.ImagesReady, s.ImagesTotal, reason, oneLine(msg, 100))
		}
		tw.Flush()
		for _, s := range n.Sets {
			for _, f := range s.FailedImages {
				fmt.Fprintf(w, "  %s: %s %s: %s\n", s.Name, f.Reason, f.Image, oneLine(f.Error, 200))
			}
		}
	}
	for _, fe := range n.FileErrors {
		fmt.Fprintf(w, "file error: %s\n", oneLine(fe.Error, 300))
	}
	for _, f := range n.Faults {
		fmt.Fprintf(w, "fault: %s\n", oneLine(f, 300))
	}
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > max {
		s = s[:max-1] + "…"
	}
	return s
}

// configAndPlatform is imagepind's config and a --platform value, for the commands that
// reach registries.
func configAndPlatform(fs *flag.FlagSet, configPath, platform string) (conf.Config, diskcheck.Platform, error) {
	cfg, err := loadConfig(fs, configPath)
	if err != nil {
		return cfg, diskcheck.Platform{}, err
	}
	p, err := diskcheck.ParsePlatform(platform)
	return cfg, p, err
}

// loadConfig reads imagepind's config; the default path may be absent.
func loadConfig(fs *flag.FlagSet, path string) (conf.Config, error) {
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "config" })
	return conf.LoadConfig(path, explicit)
}
