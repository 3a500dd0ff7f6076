package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	goruntime "runtime"
	"strings"

	"go.podman.io/image/v5/types"
	"sigs.k8s.io/yaml"

	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/internal/wire"
	"github.com/imagepin/imagepin/release"
)

// MaxImagesV1 is the shipped machineconfiguration.openshift.io/v1 API's limit per set.
const MaxImagesV1 = 500

type poolsFlag []string

func (p *poolsFlag) String() string     { return strings.Join(*p, ",") }
func (p *poolsFlag) Set(v string) error { *p = append(*p, v); return nil }

// releaseSets prints PinnedImageSet documents (the shipped v1 shape) for a release: per
// pool, deduplicated, the release image on control-plane pools only, the pool's OS stream
// only, split into sets of at most 500 names, named PREFIX-<pool>-<n>, deterministic.
func releaseSets(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", conf.DefaultConfigPath, "imagepind's config (registries.conf, certs.d, pull secret)")
	var pools poolsFlag
	fs.Var(&pools, "pool", "a machine config pool (repeatable; default: worker and master)")
	stream := fs.String("os-stream", "", "OS image stream (default: the release's default)")
	prefix := fs.String("name", "", "set name prefix (default: release-<version>)")
	output := fs.String("o", "yaml", "output: yaml or json")
	platform := fs.String("platform", goruntime.GOOS+"/"+goruntime.GOARCH, "platform to read a multi payload's contents with")
	// Flags may follow the pull spec.
	var pullSpec string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		if pullSpec != "" {
			fmt.Fprintln(stderr, "usage: imagepinctl release PULLSPEC [--pool P]... [--os-stream S] [--name PREFIX] [-o yaml|json]")
			return 2
		}
		pullSpec, rest = fs.Arg(0), fs.Args()[1:]
	}
	if pullSpec == "" {
		fmt.Fprintln(stderr, "usage: imagepinctl release PULLSPEC [--pool P]... [--os-stream S] [--name PREFIX] [-o yaml|json]")
		return 2
	}
	if len(pools) == 0 {
		pools = poolsFlag{"worker", "master"}
	}
	cfg, p, err := configAndPlatform(fs, *configPath, *platform)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	resolver := wire.Resolver(cfg)
	sysFor := func(image string) *types.SystemContext {
		sys := resolver.SystemContext(image)
		sys.OSChoice, sys.ArchitectureChoice, sys.VariantChoice = p.OS, p.Architecture, p.Variant
		return sys
	}
	rel, err := release.Expand(ctx, release.DockerSource(sysFor), pullSpec)
	if err != nil {
		fmt.Fprintf(stderr, "imagepinctl release: %v\n", err)
		return 1
	}
	docs, err := releaseDocuments(rel, pools, *stream, *prefix)
	if err != nil {
		fmt.Fprintf(stderr, "imagepinctl release: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "release %s (%s%s): %d components, OS streams %s (default %s)\n", rel.Version, pullSpec,
		map[bool]string{true: ", multi", false: ""}[rel.Multi], len(rel.Components), strings.Join(rel.StreamNames(), ", "), rel.DefaultStream)
	switch *output {
	case "json":
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(map[string]any{"apiVersion": "v1", "kind": "List", "items": docs})
	case "yaml":
		for i, d := range docs {
			b, err := yaml.Marshal(d)
			if err != nil {
				return 2
			}
			if i > 0 {
				fmt.Fprintln(stdout, "---")
			}
			stdout.Write(b)
		}
	default:
		fmt.Fprintf(stderr, "imagepinctl release: -o %s: want yaml or json\n", *output)
		return 2
	}
	return 0
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
				"apiVersion": conf.APIVersionV1,
				"kind":       conf.KindPinnedImageSet,
				"metadata": map[string]any{
					"name":   name,
					"labels": map[string]string{conf.RoleLabel: pool},
				},
				"spec": map[string]any{"pinnedImages": pinned},
			})
		}
	}
	return docs, nil
}

func validateName(name string) error {
	doc := fmt.Sprintf("apiVersion: %s\nkind: PinnedImageSet\nmetadata: {name: %q}\nspec: {pinnedImages: [{name: \"quay.io/x/y@sha256:%s\"}]}\n",
		conf.APIVersionV1, name, strings.Repeat("0", 64))
	_, err := conf.ParseSetFile("name", []byte(doc))
	return err
}
