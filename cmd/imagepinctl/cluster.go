package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/imagepin/imagepin/aggregator"
	"github.com/imagepin/imagepin/diskcheck"
)

// clusterStatus shows the aggregator's per-set view; with watch it redraws every
// interval until interrupted.
func clusterStatus(ctx context.Context, o *statusOptions, stdout, stderr io.Writer) int {
	client := &http.Client{Timeout: 10 * time.Second}
	url := aggregatorURL(o.aggregator)
	for {
		sets, err := fetchSets(ctx, client, url, o.output.value == outWide)
		if err != nil {
			fmt.Fprintf(stderr, "imagepinctl status: %v\n", err)
			if !o.watch {
				return exitUsage
			}
		} else {
			if o.watch && !o.output.data() {
				fmt.Fprint(stdout, "\033[H\033[2J") // redraw in place
			}
			if o.output.data() {
				if err := o.output.writeData(stdout, sets); err != nil {
					fmt.Fprintf(stderr, "imagepinctl status: %v\n", err)
					return exitUsage
				}
			} else {
				printCluster(stdout, url, sets, time.Now(), o.output.value == outWide)
			}
			if !o.watch {
				for _, s := range sets {
					if !s.Ready {
						return exitNo
					}
				}
				return exitOK
			}
		}
		select {
		case <-ctx.Done():
			return exitOK
		case <-time.After(o.interval):
		}
	}
}

// aggregatorURL accepts the aggregator's address with or without a scheme.
func aggregatorURL(s string) string {
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	return strings.TrimSuffix(s, "/")
}

// fetchSets reads every set; allNodes lists every node of each, not only those that are
// not Ready.
func fetchSets(ctx context.Context, client *http.Client, url string, allNodes bool) ([]aggregator.SetView, error) {
	path := "/v1/sets"
	if allNodes {
		path += "?nodes=all"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("aggregator: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("aggregator: %s", resp.Status)
	}
	var sets []aggregator.SetView
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&sets); err != nil {
		return nil, fmt.Errorf("aggregator: %w", err)
	}
	return sets, nil
}

func printCluster(w io.Writer, url string, sets []aggregator.SetView, now time.Time, wide bool) {
	fmt.Fprintf(w, "cluster view from %s at %s\n", url, now.Format(time.TimeOnly))
	if len(sets) == 0 {
		fmt.Fprintln(w, "no node reports any set")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SET\tREADY\tNODES READY\tFAILED\tPROGRESSING\tUNKNOWN\tIMAGES\tPROGRESS\tETA")
	for _, s := range sets {
		eta := "-"
		if s.ETASeconds != nil {
			eta = (time.Duration(*s.ETASeconds) * time.Second).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%v\t%d/%d\t%d\t%d\t%d\t%d/%d\t%s\t%s\n", s.Name, s.Ready, s.ReadyNodes, s.Targeted, s.FailedNodes,
			s.ProgressingNodes, s.UnknownNodes, s.ImagesReady, s.ImagesTotal, bar(s), eta)
	}
	tw.Flush()
	for _, s := range sets {
		for _, n := range s.Nodes {
			if wide {
				fmt.Fprintf(w, "  %s on %s: %s %d/%d images %s/%s %s: %s\n", s.Name, n.Node, n.Phase, n.ImagesReady, n.ImagesTotal,
					diskcheck.Human(n.BytesReady), diskcheck.Human(n.BytesTotal), n.Reason, oneLine(n.Message, 300))
			} else if n.Phase == "Failed" || n.Phase == aggregator.PhaseUnknown {
				fmt.Fprintf(w, "  %s on %s: %s %s: %s\n", s.Name, n.Node, n.Phase, n.Reason, oneLine(n.Message, 160))
			}
		}
	}
}

// bar is a 20-cell progress bar of bytes (images when sizes are unknown).
func bar(s aggregator.SetView) string {
	done, total := float64(s.BytesReady), float64(s.BytesTotal)
	if total == 0 {
		done, total = float64(s.ImagesReady), float64(s.ImagesTotal)
	}
	frac := 0.0
	if total > 0 {
		frac = done / total
	}
	n := int(frac*20 + 0.5)
	return fmt.Sprintf("[%s%s] %3.0f%%", strings.Repeat("#", n), strings.Repeat(".", 20-n), 100*frac)
}
