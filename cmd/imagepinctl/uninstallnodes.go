package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/imagepin/imagepin/api/v1alpha1"
	"github.com/imagepin/imagepin/cluster/giveback"
)

type uninstallNodesOptions struct {
	kubeconfig, namespace, daemonSet, container string
	command, ready, startupTaint                string
	timeout                                     time.Duration
}

func newUninstallNodes() *cobra.Command {
	o := &uninstallNodesOptions{}
	cmd := &cobra.Command{
		Use:   "uninstall-nodes",
		Short: "Give every node back before imagepin is removed from the cluster (Helm's pre-delete hook)",
		Long: `uninstall-nodes gives every node back, as helm uninstall does first: it puts imagepind's
DaemonSet in uninstall mode (--command, with --ready as its readiness probe, on every node at
once), in which each node's imagepind restores the runtime's configuration as it was, releases
its pins and removes its blob store; it waits until the pod of every node the DaemonSet runs
on is in that mode and ready; then it removes imagepin's condition (` + v1alpha1.NodeConditionPinnedImagesReady + `)
and the startup taint from the Nodes.

Its access: get and patch the DaemonSet, list its pods, get, list and patch Nodes, patch their
status.
Exit 0 when every node was given back, 1 when nodes were not within --timeout (each named
with why; no Node is changed), 2 on a usage error or when the API cannot be used.`,
		Example: `  imagepinctl uninstall-nodes -n imagepin --timeout 10m \
    --command '["/imagepind","uninstall","--wait","--config=/etc/imagepin/imagepind.toml"]' \
    --ready '["/imagepind","uninstall","--status","--config=/etc/imagepin/imagepind.toml"]'`,
		GroupID: "cluster",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var command, ready []string
			if err := json.Unmarshal([]byte(o.command), &command); err != nil || len(command) == 0 {
				return fail(exitUsage, "--command %q: want a JSON list of strings, the container's command in uninstall mode", o.command)
			}
			if err := json.Unmarshal([]byte(o.ready), &ready); err != nil || len(ready) == 0 {
				return fail(exitUsage, "--ready %q: want a JSON list of strings, the readiness probe's command", o.ready)
			}
			if o.timeout <= 0 {
				return fail(exitUsage, "--timeout %s: must be positive", o.timeout)
			}
			cs, ns, err := kubeClient(o.kubeconfig)
			if err != nil {
				return fail(exitUsage, "%v", err)
			}
			if o.namespace != "" {
				ns = o.namespace
			}
			log := logrus.New()
			log.SetOutput(cmd.ErrOrStderr())
			return uninstallNodes(cmd, cs, giveback.Config{Namespace: ns, DaemonSet: o.daemonSet, Container: o.container,
				Command: command, Ready: ready, Condition: v1alpha1.NodeConditionPinnedImagesReady, StartupTaint: o.startupTaint,
				Timeout: o.timeout, Log: log})
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "the kubeconfig (default: $KUBECONFIG, ~/.kube/config, else the pod's service account)")
	f.StringVarP(&o.namespace, "namespace", "n", "", "the DaemonSet's namespace (default: the kubeconfig context's)")
	f.StringVar(&o.daemonSet, "daemonset", "imagepind", "imagepind's DaemonSet")
	f.StringVar(&o.container, "container", "imagepind", "imagepind's container in its pods")
	f.StringVar(&o.command, "command", "", "the container's command in uninstall mode, a JSON list (required)")
	f.StringVar(&o.ready, "ready", "", "the readiness probe's command in uninstall mode, a JSON list: succeeds once the node is given back (required)")
	f.StringVar(&o.startupTaint, "startup-taint", "imagepin.io/images-not-ready", `the startup taint removed from the Nodes ("": none)`)
	f.DurationVar(&o.timeout, "timeout", 4*time.Minute, "how long to wait for the nodes")
	_ = cmd.MarkFlagRequired("command")
	_ = cmd.MarkFlagRequired("ready")
	return cmd
}

func uninstallNodes(cmd *cobra.Command, cs kubernetes.Interface, cfg giveback.Config) error {
	res, err := giveback.Run(cmd.Context(), cs, cfg)
	var ng *giveback.NotGivenBack
	switch {
	case errors.As(err, &ng):
		return fail(exitNo, "%v", err)
	case err != nil:
		return fail(exitUsage, "%v", err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%d nodes given back; condition %s removed from %d Nodes, taint %s from %d\n",
		res.Nodes, cfg.Condition, res.Conditions, cfg.StartupTaint, res.Taints)
	return nil
}
