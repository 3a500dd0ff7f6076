package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/internal/bytesize"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/state"
	"github.com/imagepin/imagepin/status"
)

type statusOptions struct {
	aggregator   string
	aggregatorCA string
	kubeconfig   string
	watch        bool
	interval     time.Duration
	output       *outputFlag
}

func newStatus(g *globals) *cobra.Command {
	o := &statusOptions{}
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show this node's sets, or with --aggregator every node's",
		Long: `Show what imagepind reports for this node: per set its phase, images ready and why
not, the files it could not read and its faults (read from imagepind's status file).

With --aggregator, show the cluster view instead: per set, the nodes it targets, how many
are ready, failed, progressing or unknown, the progress by bytes and an ETA, and each
failing or unknown node with its reason.

Exit 0 only when nothing needs attention: every set shown is Ready (on every node it
targets), no node has a file error or a fault, no node is unknown, and (for this node)
imagepind is running; 1 otherwise, including a status left by an imagepind that is not
running, flagged STALE.`,
		Example: `  imagepinctl status
  imagepinctl status -o wide
  imagepinctl status -o json | jq '.sets[] | select(.phase != "Ready")'
  imagepinctl status --aggregator https://imagepin-aggregator.imagepin.svc:9444 --aggregator-ca service-ca.crt
  imagepinctl status --aggregator imagepin-aggregator.imagepin.svc:9444 --aggregator-ca service-ca.crt --watch`,
		GroupID: "node",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.output.check(); err != nil {
				return err
			}
			if o.aggregator != "" {
				return exit(clusterStatus(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr()))
			}
			if cmd.Flags().Changed("watch") {
				return fail(exitUsage, "--watch needs --aggregator")
			}
			cfg, err := g.loadConfig(cmd)
			if err != nil {
				return fail(exitUsage, "%v", err)
			}
			return exit(nodeStatus(cfg, o.output, cmd.OutOrStdout(), cmd.ErrOrStderr()))
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.aggregator, "aggregator", "", "the aggregator's read address (https://host:9444, or host:port): show the cluster view")
	f.StringVar(&o.aggregatorCA, "aggregator-ca", "", "with --aggregator: the CA of its serving certificate (OpenShift: the service CA); default: the system's roots")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "with --aggregator: the kubeconfig whose credentials it checks (default: $KUBECONFIG, then ~/.kube/config)")
	f.BoolVarP(&o.watch, "watch", "w", false, "with --aggregator: redraw until interrupted")
	f.DurationVar(&o.interval, "interval", 2*time.Second, "with --watch: how often to redraw")
	o.output = addOutputFlag(cmd, outTable, outWide, outJSON, outYAML)
	_ = cmd.RegisterFlagCompletionFunc("aggregator", cobra.NoFileCompletions)
	return cmd
}

func nodeStatus(cfg conf.Config, output *outputFlag, stdout, stderr io.Writer) int {
	n, err := status.ReadFile(cfg.StatusFile)
	if err != nil {
		fmt.Fprintf(stderr, "imagepinctl status: read status: %v (is imagepind running?)\n", err)
		return exitUsage
	}
	// imagepind writes its status on change only: an old file is fine while it runs, and
	// stale when nothing holds its state directory's lock.
	running, lerr := state.Running(cfg.StateDir)
	stale := lerr == nil && !running
	if stale {
		fmt.Fprintf(stderr, "imagepinctl status: STALE: imagepind is not running (nothing holds %s's lock); this is its last status, from %s\n",
			cfg.StateDir, n.Updated.Local().Format(time.DateTime))
	}
	if output.data() {
		if err := output.writeData(stdout, n); err != nil {
			fmt.Fprintf(stderr, "imagepinctl status: %v\n", err)
			return exitUsage
		}
	} else {
		printStatus(stdout, n, output.value == outWide)
	}
	if stale {
		return exitNo
	}
	return nodeExit(n)
}

// nodeExit is 0 only when nothing needs attention: every set Ready, no file error, no
// fault.
func nodeExit(n status.Node) int {
	if len(n.FileErrors) > 0 || len(n.Faults) > 0 {
		return exitNo
	}
	for _, s := range n.Sets {
		if s.Phase != status.Ready {
			return exitNo
		}
	}
	return exitOK
}

// counted is n and noun, in the plural unless n is 1.
func counted(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func printStatus(w io.Writer, n status.Node, wide bool) {
	fmt.Fprintf(w, "node %s (%s), %s %s, updated %s\n", n.Node.Name, n.Node.Architecture,
		n.Node.Runtime.Name, n.Node.Runtime.Version, n.Updated.Local().Format(time.DateTime))
	if p := n.Node.Peers; p != nil {
		fmt.Fprintf(w, "blobs: %s from registries, %s from peers, %s served to peers; %s stored\n",
			bytesize.Human(uint64(p.FromRegistry)), bytesize.Human(uint64(p.FromPeers)), bytesize.Human(uint64(p.ToPeers)), bytesize.Human(uint64(p.Stored)))
	}
	if sd := n.Node.Seeded; sd != nil {
		fmt.Fprintf(w, "seeded: %s, %s, %s in the store until removed (imagepinctl seed --list)\n",
			counted(sd.Seeds, "seed"), counted(sd.Images, "image"), bytesize.Human(uint64(sd.Bytes)))
	}
	if len(n.Sets) == 0 {
		fmt.Fprintln(w, "no sets apply to this node")
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		if wide {
			fmt.Fprintln(tw, "SET\tPHASE\tIMAGES\tBYTES\tFILE\tUID\tREASON\tMESSAGE")
		} else {
			fmt.Fprintln(tw, "SET\tPHASE\tIMAGES\tREASON\tMESSAGE")
		}
		for _, s := range n.Sets {
			reason, msg := "", ""
			if c := s.Condition(status.ConditionReady); c != nil {
				reason, msg = c.Reason, c.Message
			}
			if wide {
				fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s/%s\t%s\t%s\t%s\t%s\n", s.Name, s.Phase, s.ImagesReady, s.ImagesTotal,
					bytesize.Human(s.BytesReady), bytesize.Human(s.BytesTotal), s.File, s.UID, reason, oneLine(msg, 300))
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s\t%s\n", s.Name, s.Phase, s.ImagesReady, s.ImagesTotal, reason, oneLine(msg, 100))
		}
		tw.Flush()
		for _, s := range n.Sets {
			if s.BytesFromRegistry > 0 {
				fmt.Fprintf(w, "  %s: %s fetched from registries by this node (for itself or its peers)\n", s.Name, bytesize.Human(uint64(s.BytesFromRegistry)))
			}
			for _, f := range s.FailedImages {
				fmt.Fprintf(w, "  %s: %s %s: %s\n", s.Name, f.Reason, f.Image, oneLine(f.Error, 200))
			}
		}
	}
	for _, u := range n.Untargeted {
		fmt.Fprintf(w, "set %s (%s): targets no node: %s\n", u.Name, u.File, u.Why)
	}
	if t := n.Tags; t != nil {
		fmt.Fprintf(w, "tags: %d pinned, %d held by the runtime, %d moved in their registry\n", t.Pinned, t.Held, len(t.Moved))
		for _, m := range t.Moved {
			fmt.Fprintf(w, "  moved: %s is %s in its registry since %s; the node keeps the pinned %s until the set changes\n",
				m.Tag, m.Registry, m.Since.Local().Format(time.DateTime), m.Pinned)
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
func (g *globals) configAndPlatform(cmd *cobra.Command, platform string) (conf.Config, registry.Platform, error) {
	cfg, err := g.loadConfig(cmd)
	if err != nil {
		return cfg, registry.Platform{}, err
	}
	p, err := registry.ParsePlatform(platform)
	return cfg, p, err
}

// platformCompletion offers the platforms OpenShift and Kubernetes nodes run.
func platformCompletion(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return []string{"linux/amd64", "linux/arm64", "linux/ppc64le", "linux/s390x"}, cobra.ShellCompDirectiveNoFileComp
}
