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
)

// clusterStatus shows the aggregator's per-set view; with watch it redraws every
// interval until interrupted.
func clusterStatus(ctx context.Context, url string, watch bool, interval time.Duration, output string, stdout, stderr io.Writer) int {
	client := &http.Client{Timeout: 10 * time.Second}
	url = strings.TrimSuffix(url, "/")
	for {
		sets, err := fetchSets(ctx, client, url)
		if err != nil {
			fmt.Fprintf(stderr, "imagepinctl: %v\n", err)
			if !watch {
				return 2
			}
		} else {
			if watch {
				fmt.Fprint(stdout, "\033[H\033[2J") // redraw in place
			}
			if output == "json" {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				enc.Encode(sets)
			} else {
				printCluster(stdout, url, sets, time.Now())
			}
			if !watch {
				for _, s := range sets {
					if !s.Ready {
						return 1
					}
				}
				return 0
			}
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(interval):
		}
	}
}

func fetchSets(ctx context.Context, client *http.Client, url string) ([]aggregator.SetView, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/sets", nil)
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

func printCluster(w io.Writer, url string, sets []aggregator.SetView, now time.Time) {
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
			if n.Phase == "Failed" || n.Phase == aggregator.PhaseUnknown {
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
