package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/cmd/internal/wire"
	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/diskcheck"
	"github.com/imagepin/imagepin/internal/bytesize"
	"github.com/imagepin/imagepin/internal/fsutil"
	"github.com/imagepin/imagepin/kubelet"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/pullcreds"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/registrygone"
	"github.com/imagepin/imagepin/release"
	"github.com/imagepin/imagepin/report"
	"github.com/imagepin/imagepin/status"
)

// check runs the disk and reachability check alone, for this node (or --platform and
// --labels), and prints the plan per set: what an administrator runs before an upgrade
// window. Exit 0 when every set is admitted and every image reachable.
type checkOptions struct {
	// registryGone: exit 0 only when the node is ready to lose its registry.
	registryGone bool
	platform     string
	labels       string
	storage      string
	output       *outputFlag
}

func newCheck(g *globals) *cobra.Command {
	o := &checkOptions{}
	cmd := &cobra.Command{
		Use:   "check FILE...",
		Short: "Before an upgrade window: can this node hold and reach the sets' images?",
		Long: `Run imagepind's disk and reachability check alone, for the sets in the files that select
this node (or the node described by --labels and --platform), and print per set the
verdict and each missing image with its size and the endpoint that serves it (a mirror
from registries.conf, or the source), or why no endpoint can.

Images already present in CRI-O count as present; when CRI-O does not answer every image
counts as missing and --storage is the image filesystem. Nothing is pinned or pulled.

Each set also says whether this node is ready to lose its registry, in imagepind's words
for its RegistryIndependent condition: every image present and pinned, every tag the set
pins held by the runtime as its pinned digest, the kubelet's image pull credential
verification (its config, drop-ins and its own pull records) letting pods start from them
without the registry, and every blob of the images held by at least 2 nodes (asked of
the aggregator in [report], with the node's certificate), so that a node joining or
replacing one gets them from its peers. It names the blobs held by fewer, their holders,
and which nodes would fail to join, and then says apart whether pods on this node would
need the registry when they start, and whether a node joining would.

Exit 0 when every set is admitted and every missing image reachable, 1 if not. With
--registry-gone, exit 0 only when the node is ready to lose its registry for every set.`,
		Example: `  imagepinctl check sets/*.yaml
  imagepinctl check --platform linux/arm64 --labels node-role.kubernetes.io/worker= set.yaml
  imagepinctl check -o json set.yaml | jq '.sets[].missingImages[] | select(.error)'
  imagepinctl check --registry-gone sets/*.yaml   # before cutting the registry off`,
		GroupID:           "node",
		Args:              files,
		ValidArgsFunction: setFileArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.output.check(); err != nil {
				return err
			}
			cfg, p, err := g.configAndPlatform(cmd, o.platform)
			if err != nil {
				return fail(exitUsage, "%v", err)
			}
			labels, err := nodeLabels(cfg, o.labels)
			if err != nil {
				return fail(exitUsage, "--labels: %v", err)
			}
			return exit(check(cmd.Context(), cfg, p, labels, o, args, cmd.OutOrStdout(), cmd.ErrOrStderr()))
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.registryGone, "registry-gone", false, "exit 0 only when pods can start from every set's images with the registry gone")
	f.StringVar(&o.platform, "platform", goruntime.GOOS+"/"+goruntime.GOARCH, "os/arch[/variant] to size images for")
	f.StringVar(&o.labels, "labels", "", "node labels k=v,k2=v2 (default: the config's labels and labels file)")
	f.StringVar(&o.storage, "storage", "/var/lib/containers/storage", "image filesystem when CRI-O is not reachable")
	o.output = addOutputFlag(cmd, outTable, outJSON, outYAML)
	_ = cmd.RegisterFlagCompletionFunc("platform", platformCompletion)
	_ = cmd.MarkFlagDirname("storage")
	return cmd
}

func check(ctx context.Context, cfg conf.Config, p registry.Platform, labels map[string]string, o *checkOptions, files []string, stdout, stderr io.Writer) int {
	var sets []pinset.Set
	for _, f := range files {
		data, err := fsutil.ReadRegular(f, pinset.MaxSetFileSize)
		if err != nil {
			fmt.Fprintf(stdout, "%s: %v\n", f, err)
			return exitNo
		}
		res, err := pinset.ParseSetFile(f, data)
		if err != nil {
			fmt.Fprintln(stdout, err)
			return exitNo
		}
		for _, s := range res.Sets {
			if s.Selector.Matches(labels) {
				sets = append(sets, s)
			} else {
				fmt.Fprintf(stderr, "%s: set %q does not apply to this node (%s)\n", f, s.Name, s.Selector)
			}
		}
	}
	sort.Slice(sets, func(i, j int) bool { return sets[i].Name < sets[j].Name })

	// containers/image names the endpoint it tries only in its log.
	recorder := registry.NewEndpointRecorder()
	logrus.StandardLogger().SetOutput(io.Discard)
	logrus.StandardLogger().SetLevel(logrus.InfoLevel)
	logrus.StandardLogger().AddHook(recorder)
	keyring := &pullcreds.SecretFile{Path: cfg.CRI.PullSecret}
	rc, _ := wire.RegistryAccess(cfg, wire.GuessRuntime(cfg), filepath.Join(os.TempDir(), "imagepinctl"))
	rc.Platform, rc.LogEndpoints = p, true
	resolver := registry.New(rc, keyring.Lookup)

	// A set naming a release needs what imagepind would expand it to on this node.
	releases := expandReleaseSets(ctx, resolver, labels, sets)

	// Presence and the image filesystem from CRI-O when it answers.
	client, err := cri.Dial(cfg.CRI.Endpoint)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitUsage
	}
	defer client.Close()
	reachable := true
	var runtimeErr error
	vctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	if _, err := client.Version(vctx); err != nil {
		reachable, runtimeErr = false, err
		fmt.Fprintf(stderr, "the container runtime not reachable at %s (%v): every image counts as missing; image filesystem %s\n", cfg.CRI.Endpoint, err, o.storage)
	}
	cancel()
	var reqs []diskcheck.SetRequest
	total := map[string]int{}
	unpinned := map[string][]string{}
	for _, s := range sets {
		r := diskcheck.SetRequest{Name: s.Name}
		total[s.Name] = len(s.Images)
		for _, img := range s.Images {
			if reachable {
				st, err := client.ImageStatus(ctx, img)
				if err == nil && st.Present {
					if !st.Pinned {
						unpinned[s.Name] = append(unpinned[s.Name], img)
					}
					r.Present = append(r.Present, img)
					continue
				}
			}
			r.Missing = append(r.Missing, img)
		}
		reqs = append(reqs, r)
	}
	node := readNode(ctx, cfg, client, runtimeErr)
	node.holders = askAggregator(ctx, cfg)
	imageFS := wire.ImageFS(client)
	if !reachable {
		imageFS = func(context.Context) (string, error) { return o.storage, nil }
	}

	nodeName, _ := wire.NodeName(cfg)
	// The policy imagepind admits by ([peers] on CRI-O also keeps each layer compressed).
	dc := wire.DiskCheckConfig(cfg, wire.GuessRuntime(cfg), nodeName)
	// As imagepind does, what the node's blob store holds (seeded images) is sized from it.
	if cfg.Peers.Enabled {
		if dir := wire.StoreDir(cfg, cfg.StateDir); isDir(dir) {
			if store, err := blobstore.Open(dir); err == nil {
				dc.Store = store
			}
		}
	}
	checker := diskcheck.New(dc, resolver, imageFS)
	res, err := checker.Check(ctx, reqs, nil)
	if err != nil {
		fmt.Fprintf(stderr, "imagepinctl check: %v\n", err)
		return exitUsage
	}

	ok, ready := true, true
	var plans []setPlan
	for i, r := range reqs {
		v := res.Verdicts[r.Name]
		plan := setPlan{Set: r.Name, Images: total[r.Name], Missing: len(r.Missing), Admitted: v.Admitted,
			Need:    needRange{Floor: v.Need, Most: v.NeedMost, ForStore: v.ForStore},
			Verdict: v.Condition.Reason, Message: v.Condition.Message, Release: releases[r.Name]}
		notReady := ""
		if rel := releases[r.Name]; rel != nil && rel.Error != "" {
			plan.Admitted, plan.Verdict, plan.Message = false, "ReleaseUnavailable",
				fmt.Sprintf("release %s cannot be expanded, so its images cannot be checked: %s", rel.Image, rel.Error)
			notReady = plan.Message
		}
		for _, img := range r.Missing {
			ip := imagePlan{Image: img, Bytes: v.Bytes[img], Endpoint: recorder.Endpoint(img)}
			if why, bad := v.Unavailable[img]; bad {
				ip.Error, ip.Endpoint = "unavailable: "+why, ""
				plan.Unreachable++
			} else if why, unsized := v.Unsized[img]; unsized {
				ip.Error, ip.Endpoint = "not reachable now: "+why, ""
				plan.Unreachable++
			}
			plan.Bytes += ip.Bytes
			plan.ImagesPlan = append(plan.ImagesPlan, ip)
		}
		ok = ok && plan.Admitted && plan.Unreachable == 0
		// reqs follow sets, one each.
		plan.RegistryGone = node.registryGone(sets[i], r.Missing, unpinned[r.Name], notReady)
		ready = ready && plan.RegistryGone.Ready
		plans = append(plans, plan)
	}
	report := checkReport{Node: nodeName, Platform: p.String(), Filesystem: res.Filesystem, Sets: plans}
	if o.output.data() {
		if err := o.output.writeData(stdout, report); err != nil {
			fmt.Fprintf(stderr, "imagepinctl check: %v\n", err)
			return exitUsage
		}
	} else {
		printPlan(stdout, report)
	}
	if !ok || (o.registryGone && !ready) {
		return exitNo
	}
	return exitOK
}

// registryGone is a set's answer to "can pods start from its images on this node with
// the registry gone?": registrygone.Decide's verdict, as imagepind's RegistryIndependent
// condition says it.
type registryGone struct {
	// Ready: Status True. Unknown is not ready.
	Ready bool `json:"ready"`
	// Status, Reason and Message are the RegistryIndependent condition's.
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// Why lists what stands in the way (nothing when Ready).
	Why []string `json:"why,omitempty"`
	// Policy is the kubelet's image pull credential verification policy in effect.
	Policy string `json:"policy,omitempty"`
	// Kubelet is the answer of the kubelet's credential verification alone: Starts,
	// NeedsRegistry or Unknown (empty when its files cannot be read).
	Kubelet string `json:"kubelet,omitempty"`
	// NeedRegistry are the images the kubelet would take to the registry at pod start,
	// Unsure those for which it cannot be told.
	NeedRegistry []kubelet.Need `json:"needRegistry,omitempty"`
	Unsure       []kubelet.Need `json:"unsure,omitempty"`
	// Node is the node-local part alone (imagepind's PodsStartWithoutRegistry): whether
	// pods start from the set's images on this node with the registry gone, whatever
	// the count of holders.
	Node nodePart `json:"node"`
	// BlobHolders is the aggregator's count of the nodes holding every blob of the
	// set's images: a node joining or replacing one gets them from those.
	BlobHolders status.BlobHolders `json:"blobHolders"`
}

// nodePart is registrygone.Part as JSON.
type nodePart struct {
	Status  string   `json:"status"`
	Reason  string   `json:"reason"`
	Message string   `json:"message"`
	Why     []string `json:"why,omitempty"`
}

// nodeFacts are what the set's verdicts share, read once: whether the runtime answers,
// the image names it lists (with their IDs), the kubelet's credential verification, and
// where the count of the holders of the images' blobs comes from.
type nodeFacts struct {
	runtimeErr error
	ids        map[string]string
	v          kubelet.Verification
	verr       error
	// holders counts the nodes holding every blob of images (the aggregator's); nil:
	// none can be had.
	holders func(images []string) status.BlobHolders
}

// askAggregator asks the aggregator imagepind reports to ([report]), with the node's
// certificate, for the holders of the blobs of a set's images; without one, the count
// cannot be had and no set is ready to lose its registry.
func askAggregator(ctx context.Context, cfg conf.Config) func([]string) status.BlobHolders {
	if cfg.Report.Aggregator == "" {
		return func([]string) status.BlobHolders {
			return status.HoldersUnknown("no aggregator to count them ([report] aggregator is not set in the config)")
		}
	}
	rc := report.Config{Aggregator: cfg.Report.Aggregator, CertFile: cfg.Report.Cert, KeyFile: cfg.Report.Key, CAFile: cfg.Report.CA, ServerName: cfg.Report.ServerName}
	return func(images []string) status.BlobHolders {
		h, err := report.AskHolders(ctx, rc, images)
		if err != nil {
			return status.HoldersUnknown(err.Error())
		}
		return h
	}
}

// readNode reads the kubelet's credential verification and, when the runtime answers
// (runtimeErr nil), the image names it lists.
func readNode(ctx context.Context, cfg conf.Config, client *cri.Client, runtimeErr error) nodeFacts {
	n := nodeFacts{runtimeErr: runtimeErr}
	n.v, n.verr = wire.Kubelet(cfg)()
	if runtimeErr == nil {
		var err error
		if n.ids, err = client.ImageNames(ctx); err != nil {
			n.runtimeErr = err
		}
	}
	return n
}

// registryGone is set s's verdict: missing and unpinned are its images not on the node
// and present but not pinned; notReady why its images cannot all be known ("": they
// can). The tags it pins are held when the runtime lists them with their pinned
// digests' image IDs.
func (n nodeFacts) registryGone(s pinset.Set, missing, unpinned []string, notReady string) registryGone {
	holders := status.HoldersUnknown("no aggregator to count them")
	if n.holders != nil {
		holders = n.holders(s.Images)
	}
	v := registrygone.Decide(registrygone.Facts{
		Images: s.Images, RuntimeErr: n.runtimeErr, Missing: missing, Unpinned: unpinned, NotReady: notReady,
		Tags: s.Tags, Held: registrygone.HeldTags(s.Tags, n.ids),
		KubeletRead: true, KubeletErr: n.verr, Verification: n.v, IDs: n.ids,
		Holders: holders,
	})
	rg := registryGone{Ready: v.Ready(), Status: v.Status, Reason: v.Reason, Message: v.Message, Why: v.Why, Policy: v.Policy, BlobHolders: holders,
		Node: nodePart{Status: v.Node.Status, Reason: v.Node.Reason, Message: v.Node.Message, Why: v.Node.Why}}
	if v.KubeletDecided {
		rg.Kubelet, rg.NeedRegistry, rg.Unsure = v.Kubelet.Answer.String(), v.Kubelet.Needs, v.Kubelet.Unsure
	}
	return rg
}

// says is the node-local part in a few words: whether pods on this node would pull
// when they start (the obstacles are the lines above).
func (p nodePart) says() string {
	switch p.Status {
	case status.True:
		return "pods start without the registry"
	case status.False:
		return fmt.Sprintf("pods would need the registry when they start (%s)", p.Reason)
	}
	return fmt.Sprintf("whether pods start without the registry cannot be told (%s)", p.Reason)
}

// joining is the cluster's part in a few words: whether a node joining or replacing one
// gets every blob from its peers (which blobs are short, and who would fail to join,
// are the lines above).
func joining(h status.BlobHolders) string {
	switch h.Status {
	case status.True:
		return fmt.Sprintf("every blob held by %d nodes or more", status.MinBlobHolders)
	case status.False:
		var parts []string
		if h.ShortCount > 0 {
			parts = append(parts, fmt.Sprintf("%d blobs held by fewer than %d nodes", h.ShortCount, status.MinBlobHolders))
		}
		if h.NoHolderCount > 0 {
			parts = append(parts, fmt.Sprintf("%d images pinned by no node that shares blobs", h.NoHolderCount))
		}
		return fmt.Sprintf("would need the registry (%s): %s", status.ReasonBlobsNotHeld, strings.Join(parts, ", "))
	}
	return fmt.Sprintf("cannot be told (%s)", status.ReasonBlobHoldersUnknown)
}

type checkReport struct {
	Node       string               `json:"node"`
	Platform   string               `json:"platform"`
	Filesystem diskcheck.Filesystem `json:"imageFilesystem"`
	Sets       []setPlan            `json:"sets"`
}

type setPlan struct {
	Set      string `json:"set"`
	Images   int    `json:"images"`
	Missing  int    `json:"missing"`
	Bytes    uint64 `json:"bytes"`
	Admitted bool   `json:"admitted"`
	// Unreachable counts missing images no endpoint serves now.
	Unreachable int             `json:"unreachable"`
	Verdict     string          `json:"verdict"`
	Message     string          `json:"message"`
	Release     *status.Release `json:"release,omitempty"`
	ImagesPlan  []imagePlan     `json:"missingImages"`
	// RegistryGone: whether pods start from the set's images with the registry gone.
	RegistryGone registryGone `json:"registryGone"`
	// Need is what the set needs on the image filesystem, as a range.
	Need needRange `json:"need"`
}

// needRange is a set's need (diskcheck.Verdict): the real need lies between Floor and
// Most (equal when every layer's size is known); ForStore is the part of it the
// node-local mirror's store grows by (compressed blobs it does not hold yet).
type needRange struct {
	Floor    uint64 `json:"floor"`
	Most     uint64 `json:"most"`
	ForStore uint64 `json:"forStore"`
}

// headline is the set's one-word answer, in agreement with the lines under it.
func (s setPlan) headline() string {
	switch {
	case !s.Admitted:
		return "REFUSED"
	case s.Unreachable > 0:
		return "UNREACHABLE"
	}
	return "ADMITTED"
}

type imagePlan struct {
	Image    string `json:"image"`
	Bytes    uint64 `json:"bytes"`
	Endpoint string `json:"endpoint,omitempty"`
	Error    string `json:"error,omitempty"`
}

func printPlan(w io.Writer, r checkReport) {
	fmt.Fprintf(w, "node %s (%s), image filesystem %s: %s free of %s\n", r.Node, r.Platform, r.Filesystem.Path,
		bytesize.Human(r.Filesystem.FreeBytes), bytesize.Human(r.Filesystem.CapacityBytes))
	for _, s := range r.Sets {
		unreachable := ""
		if s.Unreachable > 0 {
			unreachable = fmt.Sprintf("; %d of them cannot be reached", s.Unreachable)
		}
		fmt.Fprintf(w, "\nset %s: %s — %d of %d images missing, %s compressed%s\n", s.Set, s.headline(), s.Missing, s.Images, bytesize.Human(s.Bytes), unreachable)
		if s.Release != nil && s.Release.Error == "" {
			fmt.Fprintf(w, "  release %s (%s): %d images for this node\n", s.Release.Version, s.Release.Image, s.Release.Images)
		}
		fmt.Fprintf(w, "  %s: %s\n", s.Verdict, s.Message)
		switch rg := s.RegistryGone; {
		case rg.Ready:
			fmt.Fprintf(w, "  registry gone: ready: %s\n", oneLine(rg.Message, 600))
		case rg.Status == status.Unknown:
			fmt.Fprintf(w, "  registry gone: NOT READY (cannot be told: %s)\n", rg.Reason)
		default:
			fmt.Fprintf(w, "  registry gone: NOT READY (%s)\n", rg.Reason)
		}
		if !s.RegistryGone.Ready {
			for _, why := range s.RegistryGone.Why {
				fmt.Fprintf(w, "      %s\n", oneLine(why, 600))
			}
			fmt.Fprintf(w, "    on this node: %s\n", s.RegistryGone.Node.says())
			fmt.Fprintf(w, "    for a node joining or replacing one: %s\n", joining(s.RegistryGone.BlobHolders))
		}
		for _, ip := range s.ImagesPlan {
			switch {
			case ip.Error != "":
				fmt.Fprintf(w, "  ✗ %s\n      %s\n", ip.Image, oneLine(ip.Error, 600))
			default:
				from := ip.Endpoint
				if from == "" {
					from = "?"
				}
				fmt.Fprintf(w, "  ✓ %s  %s  from %s\n", ip.Image, bytesize.Human(ip.Bytes), from)
			}
		}
	}
}

// nodeLabels are --labels, or the config's inline labels overlaid with its labels file.
func nodeLabels(cfg conf.Config, flagValue string) (map[string]string, error) {
	if flagValue != "" {
		labels := map[string]string{}
		for _, kv := range strings.Split(flagValue, ",") {
			k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
			labels[k] = v
		}
		return labels, pinset.ValidateLabels(labels)
	}
	var file map[string]string
	if cfg.Node.LabelsFile != "" {
		if data, err := fsutil.ReadRegular(cfg.Node.LabelsFile, pinset.MaxLabelsFileSize); err == nil {
			l, err := pinset.ParseLabelsFile(data)
			if err != nil {
				return nil, fmt.Errorf("labels file %s: %w", cfg.Node.LabelsFile, err)
			}
			file = l
		}
	}
	return pinset.MergeLabels(cfg.Node.Labels, file), nil
}

// expandReleaseSets adds to each set naming a release the images imagepind would expand
// it to on this node (its role, its OS stream), through the same registry access, and
// returns what each release gave.
func expandReleaseSets(ctx context.Context, resolver *registry.Client, labels map[string]string, sets []pinset.Set) map[string]*status.Release {
	out := map[string]*status.Release{}
	for i, s := range sets {
		if s.ReleaseImage == "" {
			continue
		}
		r := &status.Release{Image: s.ReleaseImage}
		out[s.Name] = r
		rel, err := release.Expand(ctx, resolver, s.ReleaseImage)
		var images []string
		if err == nil {
			r.Version = rel.Version
			images, err = rel.ForNode(labels, s.OSImageStream)
		}
		if err != nil {
			r.Error = err.Error()
			continue
		}
		r.Images = len(images)
		sets[i].Images = release.Merge(s.Images, images)
	}
	return out
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}
