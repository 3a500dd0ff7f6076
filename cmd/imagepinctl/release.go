package main

import (
	"context"
	"fmt"
	"io"
	goruntime "runtime"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/imagepin/imagepin/cmd/internal/wire"
	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/release"
)

// MaxImagesV1 is the shipped machineconfiguration.openshift.io/v1 API's limit per set.
const MaxImagesV1 = 500

type releaseOptions struct {
	pools    []string
	stream   string
	prefix   string
	platform string
	output   *outputFlag
}

func newRelease(g *globals) *cobra.Command {
	o := &releaseOptions{}
	cmd := &cobra.Command{
		Use:   "release PULLSPEC",
		Short: "Write PinnedImageSets (v1) for an OpenShift release, per machine config pool",
		Long: `Read an OpenShift release image (by digest) through the node's registry configuration
(registries.conf mirrors, certs.d, the pull secret) and write PinnedImageSet documents in
the shipped machineconfiguration.openshift.io/v1 shape: per pool, deduplicated, the
release image itself on control-plane pools only, only the OS images of the chosen
stream, split into sets of at most 500 images named PREFIX-<pool>-<n>. The output is
deterministic: the same release gives the same documents.`,
		Example: `  imagepinctl release quay.io/openshift-release-dev/ocp-release@sha256:… > release-sets.yaml
  imagepinctl release quay.io/openshift-release-dev/ocp-release@sha256:… --pool worker --pool infra \
      --os-stream rhel-10 --name upgrade-4-20 -o json`,
		GroupID: "sets",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("want one PULLSPEC, got %d arguments: usage: %s", len(args), cmd.UseLine())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.output.check(); err != nil {
				return err
			}
			if len(o.pools) == 0 {
				o.pools = []string{"worker", "master"}
			}
			cfg, p, err := g.configAndPlatform(cmd, o.platform)
			if err != nil {
				return fail(exitUsage, "%v", err)
			}
			return releaseSets(cmd.Context(), cfg, p, o, args[0], cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&o.pools, "pool", nil, "a machine config pool (repeatable; default: worker and master)")
	f.StringVar(&o.stream, "os-stream", "", "OS image stream (default: the release's default)")
	f.StringVar(&o.prefix, "name", "", "set name prefix (default: release-<version>)")
	f.StringVar(&o.platform, "platform", goruntime.GOOS+"/"+goruntime.GOARCH, "platform to read a multi payload's contents with")
	o.output = addOutputFlag(cmd, outYAML, outJSON)
	_ = cmd.RegisterFlagCompletionFunc("pool", cobra.FixedCompletions([]string{"worker", "master", "infra"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("platform", platformCompletion)
	return cmd
}

// releaseSets prints PinnedImageSet documents (the shipped v1 shape) for a release.
func releaseSets(ctx context.Context, cfg conf.Config, p registry.Platform, o *releaseOptions, pullSpec string, stdout, stderr io.Writer) error {
	rel, err := release.Expand(ctx, wire.RegistryOn(cfg, p), pullSpec)
	if err != nil {
		return fail(exitNo, "%v", err)
	}
	docs, err := releaseDocuments(rel, o.pools, o.stream, o.prefix)
	if err != nil {
		return fail(exitNo, "%v", err)
	}
	fmt.Fprintf(stderr, "release %s (%s%s): %d components, OS streams %s (default %s)\n", rel.Version, pullSpec,
		map[bool]string{true: ", multi", false: ""}[rel.Multi], len(rel.Components), strings.Join(rel.StreamNames(), ", "), rel.DefaultStream)
	if o.output.value == outJSON {
		return o.output.writeData(stdout, map[string]any{"apiVersion": "v1", "kind": "List", "items": docs})
	}
	return writeYAMLDocuments(stdout, docs)
}

// writeYAMLDocuments prints documents separated by "---".
func writeYAMLDocuments(w io.Writer, docs []map[string]any) error {
	for i, d := range docs {
		b, err := yaml.Marshal(d)
		if err != nil {
			return err
		}
		if i > 0 {
			fmt.Fprintln(w, "---")
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// releaseDocuments builds the v1 documents.
func releaseDocuments(rel release.Release, pools []string, stream, prefix string) ([]map[string]any, error) {
	if prefix == "" {
		prefix = "release-" + rel.Version
	}
	var docs []map[string]any
	for _, pool := range pools {
		controlPlane := pool == "master" || pool == "control-plane"
		images, err := rel.Images(controlPlane, stream)
		if err != nil {
			return nil, err
		}
		for n, start := 1, 0; start < len(images); n, start = n+1, start+MaxImagesV1 {
			chunk := images[start:min(start+MaxImagesV1, len(images))]
			var pinned []map[string]string
			for _, img := range chunk {
				pinned = append(pinned, map[string]string{"name": img})
			}
			name := fmt.Sprintf("%s-%s-%d", prefix, pool, n)
			if err := validateName(name); err != nil {
				return nil, err
			}
			docs = append(docs, map[string]any{
				"apiVersion": pinset.APIVersionV1,
				"kind":       pinset.KindPinnedImageSet,
				"metadata": map[string]any{
					"name":   name,
					"labels": map[string]string{pinset.RoleLabel: pool},
				},
				"spec": map[string]any{"pinnedImages": pinned},
			})
		}
	}
	return docs, nil
}

func validateName(name string) error {
	doc := fmt.Sprintf("apiVersion: %s\nkind: PinnedImageSet\nmetadata: {name: %q}\nspec: {pinnedImages: [{name: \"quay.io/x/y@sha256:%s\"}]}\n",
		pinset.APIVersionV1, name, strings.Repeat("0", 64))
	_, err := pinset.ParseSetFile("name", []byte(doc))
	return err
}
