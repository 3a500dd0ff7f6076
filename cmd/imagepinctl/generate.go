package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/imagepin/imagepin/cmd/internal/wire"
	"github.com/imagepin/imagepin/internal/fsutil"
	"github.com/imagepin/imagepin/resolve"
	"github.com/imagepin/imagepin/setgen"
)

type generateOptions struct {
	kubeconfig    string
	namespace     string
	allNamespaces bool
	selector      string
	deployments   []string
	daemonSets    []string
	statefulSets  []string
	nodeSelector  string
	file          string
	output        *outputFlag
}

func newGenerate(g *globals) *cobra.Command {
	o := &generateOptions{}
	cmd := &cobra.Command{
		Use:   "generate NAME",
		Short: "Write a PinnedImageSet from the images the cluster's pods run, or a workload's next template",
		Long: `Write a PinnedImageSet named NAME (imagepin.io/v1alpha1) holding the images that run:

From pods (the default): the pods of --namespace (or every namespace with
--all-namespaces) that --selector selects, each container's image (init, regular and
ephemeral) by the digest its runtime reports in the pod's status (imageID): exactly what
runs, whatever tag it was started from. A tag the pod's spec names is kept beside the
digest as a comment ("# tag: repo:v2"): the set pins by digest. An image is pinned under
the repository the pod names when that name is fully qualified (the kubelet pulls that
name), else under the repository the runtime reports.

From workloads (--deployment, --daemonset, --statefulset, repeatable): the workload's
spec.template, the pods its next rollout creates rather than those running now. Tags are
resolved to digests as imagepinctl resolve does, through the registries.conf mirrors,
certs.d and pull secret of --config; a short name or a tag that cannot be resolved is an
error and nothing is written.

Images are listed once each, sorted: the same workloads give the same document. A
container whose runtime reports a local image ID (sha256:…, an image built or loaded on
the node, not pulled from a registry) or that has not started yet is named on stderr
and left out. The document is validated as imagepind reads it.

The cluster is read with the kubeconfig's credentials (list pods, get the workloads).
Exit 0 when a set was written, 1 when nothing could be pinned, a workload does not exist
or one of its images could not be resolved, 2 on a usage error or when the API cannot be
read.`,
		Example: `  imagepinctl generate shop -n shop > shop-set.yaml
  imagepinctl generate web -n shop -l app=web --node-selector node-role.kubernetes.io/worker= --file web.yaml
  imagepinctl generate everything --all-namespaces --node-selector "" | kubectl apply -f -
  imagepinctl generate web-v2 -n shop --deployment web --config /etc/imagepin/imagepind.toml > web-v2.yaml`,
		GroupID: "sets",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("want the set's NAME, got %d arguments: usage: %s", len(args), cmd.UseLine())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.output.check(); err != nil {
				return err
			}
			workloads := len(o.deployments) + len(o.daemonSets) + len(o.statefulSets)
			switch {
			case workloads > 0 && cmd.Flags().Changed("selector"):
				return fail(exitUsage, "--selector selects pods: with --deployment, --daemonset or --statefulset name the workloads instead")
			case workloads > 0 && o.allNamespaces:
				return fail(exitUsage, "--all-namespaces: workloads are named in one --namespace")
			case o.allNamespaces && cmd.Flags().Changed("namespace"):
				return fail(exitUsage, "--all-namespaces and --namespace: give one")
			}
			if _, err := metav1.ParseToLabelSelector(o.selector); err != nil {
				return fail(exitUsage, "--selector %q: %v", o.selector, err)
			}
			nodeSel, err := metav1.ParseToLabelSelector(o.nodeSelector)
			if err != nil {
				return fail(exitUsage, "--node-selector %q: %v", o.nodeSelector, err)
			}
			cs, ns, err := kubeClient(o.kubeconfig)
			if err != nil {
				return fail(exitUsage, "%v", err)
			}
			if o.namespace != "" {
				ns = o.namespace
			}
			if o.allNamespaces {
				ns = metav1.NamespaceAll
			}
			var res *resolve.Resolver
			if workloads > 0 {
				cfg, err := g.loadConfig(cmd)
				if err != nil {
					return fail(exitUsage, "%v", err)
				}
				res = resolve.NewResolver(wire.Registry(cfg), cfg.EffectivePullConcurrency())
			}
			return generate(cmd.Context(), cs, res, o, args[0], ns, nodeSel, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "the kubeconfig to read the cluster with (default: $KUBECONFIG, then ~/.kube/config)")
	f.StringVarP(&o.namespace, "namespace", "n", "", "the namespace of the pods or workloads (default: the kubeconfig context's, else default)")
	f.BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "the pods of every namespace")
	f.StringVarP(&o.selector, "selector", "l", "", "the pods to read, a label selector as kubectl's -l (default: every pod of the namespace)")
	f.StringArrayVar(&o.deployments, "deployment", nil, "a Deployment whose next template to pin (repeatable)")
	f.StringArrayVar(&o.daemonSets, "daemonset", nil, "a DaemonSet whose next template to pin (repeatable)")
	f.StringArrayVar(&o.statefulSets, "statefulset", nil, "a StatefulSet whose next template to pin (repeatable)")
	f.StringVar(&o.nodeSelector, "node-selector", "node-role.kubernetes.io/worker=",
		`the set's node selector, as kubectl's -l ("" selects every node)`)
	f.StringVar(&o.file, "file", "", "write the set to this file (atomically) instead of stdout")
	o.output = addOutputFlag(cmd, outYAML, outJSON)
	return cmd
}

// kubeClient is a client from the kubeconfig (explicit, else as kubectl finds it) and
// the namespace of its context ("default" when it names none).
func kubeClient(kubeconfig string) (kubernetes.Interface, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	rc, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	rc.UserAgent = "imagepinctl/" + version
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	return cs, ns, nil
}

// generate makes the set from the pods of ns, or, when res is given (the workloads'
// mode), from the templates of the workloads o names with their tags resolved by res;
// it prints what was left out and writes the set.
func generate(ctx context.Context, cs kubernetes.Interface, res *resolve.Resolver, o *generateOptions, name, ns string,
	nodeSel *metav1.LabelSelector, stdout, stderr io.Writer) error {
	var (
		result setgen.Result
		from   string
		err    error
	)
	if res != nil {
		result, from, err = fromWorkloads(ctx, cs, res, o, ns, stderr)
	} else {
		result, from, err = fromPods(ctx, cs, o.selector, ns)
	}
	if err != nil {
		return err
	}
	for _, n := range result.Notes {
		fmt.Fprintf(stderr, "note: %s\n", n)
	}
	for _, w := range result.Warnings {
		fmt.Fprintf(stderr, "left out: %s\n", w)
	}
	fmt.Fprintf(stderr, "%d images from %s; containers left out: %d\n", len(result.Images), from, len(result.Warnings))
	doc, err := setgen.Document(name, nodeSel, result, []string{"Made by imagepinctl generate from " + from + "."})
	if err != nil {
		return fail(exitNo, "set %q: %v", name, err)
	}
	if o.output.value == outJSON {
		j, err := sigsyaml.YAMLToJSON(doc)
		if err != nil {
			return fail(exitUsage, "%v", err)
		}
		var buf bytes.Buffer
		if err := json.Indent(&buf, j, "", "  "); err != nil {
			return fail(exitUsage, "%v", err)
		}
		buf.WriteByte('\n')
		doc = buf.Bytes()
	}
	if o.file != "" {
		if err := fsutil.WriteAtomic(o.file, "", doc, 0o644); err != nil {
			return fail(exitUsage, "%s: %v", o.file, err)
		}
		fmt.Fprintf(stderr, "%s: written\n", o.file)
		return nil
	}
	if _, err := stdout.Write(doc); err != nil {
		return fail(exitUsage, "%v", err)
	}
	return nil
}

// fromWorkloads is the set of the named workloads' templates, and where it came from.
func fromWorkloads(ctx context.Context, cs kubernetes.Interface, res *resolve.Resolver, o *generateOptions, ns string, stderr io.Writer) (setgen.Result, string, error) {
	var workloads []setgen.Workload
	var names []string
	for _, k := range []struct {
		kind  string
		names []string
	}{{setgen.KindDeployment, o.deployments}, {setgen.KindDaemonSet, o.daemonSets}, {setgen.KindStatefulSet, o.statefulSets}} {
		for _, n := range k.names {
			w, err := setgen.GetWorkload(ctx, cs, k.kind, ns, n)
			if apierrors.IsNotFound(err) {
				return setgen.Result{}, "", fail(exitNo, "%v", err)
			}
			if err != nil {
				return setgen.Result{}, "", fail(exitUsage, "%v", err)
			}
			workloads = append(workloads, w)
			names = append(names, strings.ToLower(k.kind)+"/"+n)
		}
	}
	result, err := setgen.FromTemplates(ctx, res, workloads)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return setgen.Result{}, "", fail(exitNo, "nothing written: every image of the templates must resolve")
	}
	return result, fmt.Sprintf("the next template of %s in namespace %s", strings.Join(names, ", "), ns), nil
}

// fromPods is the set of the pods selector selects in ns ("" every namespace), and
// where it came from.
func fromPods(ctx context.Context, cs kubernetes.Interface, selector, ns string) (setgen.Result, string, error) {
	pods, err := setgen.ListPods(ctx, cs, ns, selector)
	if err != nil {
		return setgen.Result{}, "", fail(exitUsage, "%v", err)
	}
	from := fmt.Sprintf("the %d pods", len(pods))
	if ns == metav1.NamespaceAll {
		from += " of every namespace"
	} else {
		from += " of namespace " + ns
	}
	if selector != "" {
		from += " selected by " + selector
	}
	return setgen.FromPods(pods), from, nil
}
