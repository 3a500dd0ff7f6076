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

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/imagepin/imagepin/api/readv1"
	"github.com/imagepin/imagepin/internal/bytesize"
	"github.com/imagepin/imagepin/status"
)

// clusterView is what status --aggregator shows: every set, and every node's problems.
type clusterView struct {
	Sets  []readv1.SetView  `json:"sets"`
	Nodes []readv1.NodeView `json:"nodes"`
}

// attention says whether anything in the view needs an administrator: a set not ready, a
// node unknown or with a file error or a fault, or no set at all (nothing to show).
func (v clusterView) attention() bool {
	if len(v.Sets) == 0 {
		return true
	}
	for _, s := range v.Sets {
		if !s.Ready {
			return true
		}
	}
	for _, n := range v.Nodes {
		if n.Unknown || len(n.Faults) > 0 || len(n.FileErrors) > 0 {
			return true
		}
	}
	return false
}

// clusterStatus shows the aggregator's per-set view; with watch it redraws every
// interval until interrupted.
func clusterStatus(ctx context.Context, o *statusOptions, stdout, stderr io.Writer) int {
	client, err := readClient(o.kubeconfig, o.aggregatorCA)
	if err != nil {
		fmt.Fprintf(stderr, "imagepinctl status: %v\n", err)
		return exitUsage
	}
	url := aggregatorURL(o.aggregator)
	for {
		var view clusterView
		sets, err := fetchSets(ctx, client, url, o.output.value == outWide)
		if err == nil {
			view.Sets = sets
			err = getJSON(ctx, client, url+"/v1/nodes", &view.Nodes)
		}
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
				if err := o.output.writeData(stdout, view); err != nil {
					fmt.Fprintf(stderr, "imagepinctl status: %v\n", err)
					return exitUsage
				}
			} else {
				printCluster(stdout, url, view, time.Now(), o.output.value == outWide)
			}
			if !o.watch {
				if view.attention() {
					return exitNo
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

// aggregatorURL accepts the aggregator's address with or without a scheme (HTTPS).
func aggregatorURL(s string) string {
	if !strings.Contains(s, "://") {
		s = "https://" + s
	}
	return strings.TrimSuffix(s, "/")
}

// readClient is an HTTPS client for the aggregator's read side: it trusts caFile (the
// CA of the aggregator's serving certificate; empty: the system's roots) and sends the
// credentials of a kubeconfig (kubeconfig, else $KUBECONFIG or ~/.kube/config, as
// kubectl finds them: a token, a client certificate, an exec plugin), which the
// aggregator checks with the API server. No kubeconfig at all: no credentials (an
// aggregator without --cluster, on loopback).
func readClient(kubeconfig, caFile string) (*http.Client, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	switch {
	case clientcmd.IsEmptyConfig(err) && kubeconfig == "":
		rc = &rest.Config{}
	case err != nil:
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	// The kubeconfig's credentials, not its server's CA or name: the aggregator has
	// its own serving certificate.
	rc = rest.CopyConfig(rc)
	rc.TLSClientConfig.CAFile, rc.TLSClientConfig.CAData, rc.TLSClientConfig.ServerName = caFile, nil, ""
	rc.TLSClientConfig.Insecure = false
	rt, err := rest.TransportFor(rc)
	if err != nil {
		return nil, fmt.Errorf("aggregator client: %w", err)
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: rt}, nil
}

// fetchSets reads every set; allNodes lists every node of each, not only those that are
// not Ready.
func fetchSets(ctx context.Context, client *http.Client, url string, allNodes bool) ([]readv1.SetView, error) {
	path := "/v1/sets"
	if allNodes {
		path += "?nodes=all"
	}
	var sets []readv1.SetView
	return sets, getJSON(ctx, client, url+path, &sets)
}

func getJSON(ctx context.Context, client *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("aggregator: %w", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized:
		return fmt.Errorf("aggregator: %s: %s: no credentials it accepts (use --kubeconfig, or a kubeconfig with a token or client certificate)", url, resp.Status)
	case http.StatusForbidden:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("aggregator: %s: %s (bind ClusterRole imagepin-aggregator-reader): %s", url, resp.Status, strings.TrimSpace(string(b)))
	default:
		return fmt.Errorf("aggregator: %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(v); err != nil {
		return fmt.Errorf("aggregator: %s: %w", url, err)
	}
	return nil
}

func printCluster(w io.Writer, url string, view clusterView, now time.Time, wide bool) {
	fmt.Fprintf(w, "cluster view from %s at %s\n", url, now.Format(time.TimeOnly))
	defer printNodeProblems(w, view.Nodes)
	sets := view.Sets
	if len(sets) == 0 {
		fmt.Fprintf(w, "no node reports any set (%d nodes known)\n", len(view.Nodes))
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SET\tREADY\tNODES READY\tFAILED\tPROGRESSING\tUNKNOWN\tIMAGES\tPROGRESS\tETA\tREGISTRY GONE")
	for _, s := range sets {
		eta := "-"
		if s.ETASeconds != nil {
			eta = (time.Duration(*s.ETASeconds) * time.Second).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%v\t%d/%d\t%d\t%d\t%d\t%d/%d\t%s\t%s\t%s\n", s.Name, s.Ready, s.ReadyNodes, s.Targeted, s.FailedNodes,
			s.ProgressingNodes, s.UnknownNodes, s.ImagesReady, s.ImagesTotal, bar(s), eta, withoutRegistry(s))
	}
	tw.Flush()
	for _, s := range sets {
		if s.BytesFromRegistry > 0 {
			// [peers]: what the cluster's nodes fetched from registries for the set.
			fmt.Fprintf(w, "  %s: %s fetched from registries by its nodes (the set's layers: %s a node)\n", s.Name,
				bytesize.Human(uint64(s.BytesFromRegistry)), bytesize.Human(perNode(s)))
		}
		for _, n := range s.RegistryDependent {
			fmt.Fprintf(w, "  %s on %s: Ready, would need the registry when a pod starts: %s: %s\n", s.Name, n.Node, n.Reason, oneLine(n.Message, 160))
		}
		if more := s.RegistryDependentNodes - len(s.RegistryDependent); more > 0 {
			fmt.Fprintf(w, "  %s: %d more Ready nodes would need the registry when a pod starts\n", s.Name, more)
		}
		if s.Targeted > 0 && s.BlobHolders.Status != status.True {
			// Which blobs a node joining or replacing one would not find, and why.
			fmt.Fprintf(w, "  %s: blobs, for a node joining or replacing one: %s\n", s.Name, s.BlobHolders.Why())
		}
		for _, n := range s.Nodes {
			if wide {
				fmt.Fprintf(w, "  %s on %s: %s %d/%d images %s/%s %s: %s\n", s.Name, n.Node, n.Phase, n.ImagesReady, n.ImagesTotal,
					bytesize.Human(n.BytesReady), bytesize.Human(n.BytesTotal), n.Reason, oneLine(n.Message, 300))
			} else if n.Phase == "Failed" || n.Phase == readv1.PhaseUnknown {
				fmt.Fprintf(w, "  %s on %s: %s %s: %s\n", s.Name, n.Node, n.Phase, n.Reason, oneLine(n.Message, 160))
			}
		}
	}
}

// withoutRegistry says whether the set's pods start with the registry gone and a node
// joining gets every blob from its peers: "yes", else, apart, on how many nodes pods
// start without it and how many blobs (or images) have too few holders.
func withoutRegistry(s readv1.SetView) string {
	h := s.BlobHolders
	switch {
	case s.Targeted == 0:
		return "-"
	case s.RegistryGone():
		return "yes"
	}
	var parts []string
	if s.PodsStartNodes < s.Targeted {
		parts = append(parts, fmt.Sprintf("pods start on %d/%d nodes", s.PodsStartNodes, s.Targeted))
	}
	switch {
	case h.Status == status.False && h.NoHolderCount > 0:
		parts = append(parts, fmt.Sprintf("%d images held by no node", h.NoHolderCount))
	case h.Status == status.False:
		parts = append(parts, fmt.Sprintf("%d blobs held by < %d nodes", h.ShortCount, status.MinBlobHolders))
	case h.Status != status.True && len(parts) == 0:
		return "unknown: blob holders"
	case h.Status != status.True:
		parts = append(parts, "blob holders unknown")
	}
	return "no: " + strings.Join(parts, ", ")
}

// bar is a 20-cell progress bar of bytes (images when sizes are unknown).
func bar(s readv1.SetView) string {
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

// printNodeProblems lists what nodes report beside their sets: unknown nodes, files
// they could not use, faults.
func printNodeProblems(w io.Writer, nodes []readv1.NodeView) {
	for _, n := range nodes {
		switch {
		case n.NeverReported:
			fmt.Fprintf(w, "node %s: Unknown: never reported\n", n.Name)
		case n.Unknown:
			fmt.Fprintf(w, "node %s: Unknown: silent for %s\n", n.Name, (time.Duration(n.AgeSeconds) * time.Second).String())
		}
		for _, fe := range n.FileErrors {
			fmt.Fprintf(w, "node %s: file error: %s\n", n.Name, oneLine(fe.Error, 300))
		}
		for _, f := range n.Faults {
			fmt.Fprintf(w, "node %s: fault: %s\n", n.Name, oneLine(f, 300))
		}
	}
}

// perNode is a set's bytes on one node (its nodes' total over how many reported).
func perNode(s readv1.SetView) uint64 {
	if n := s.ReadyNodes + s.FailedNodes + s.ProgressingNodes; n > 0 {
		return s.BytesTotal / uint64(n)
	}
	return s.BytesTotal
}
