package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/imagepin/imagepin/cmd/internal/wire"
	"github.com/imagepin/imagepin/internal/fsutil"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/resolve"
)

type resolveOptions struct {
	write    bool
	keepTags bool
	name     string
	selector string
	output   *outputFlag
}

func newResolve(g *globals) *cobra.Command {
	o := &resolveOptions{}
	cmd := &cobra.Command{
		Use:   "resolve FILE...",
		Short: "Replace image tags with digests in set files (or make a set from a list of images)",
		Long: `Look up each tag in the files in its registry, the way CRI-O would pull it: through the
node's registries.conf mirrors, certs.d and the pull secret (from --config). Write the
files back with each reference by digest (repository@sha256:…), listing on stderr every
reference changed. For a multi-architecture image the digest is the manifest list's (OCI
index's), which every architecture pulls by.

A FILE is a PinnedImageSet file (YAML or JSON, one or many documents, a List), or a plain
list of image references (one per line, # comments, or a YAML sequence), which becomes
one imagepin.io/v1alpha1 PinnedImageSet named --name for the nodes --selector selects.

A reference without a tag resolves :latest (and says so); one with a tag and a digest
keeps the digest; one already by digest is kept. With --keep-tags a pinned image that
named a tag is written repository:tag@sha256:…: the nodes then also know the tag as that
digest, so pods naming the tag start with the registry gone (docs/tags.md); a release
image is always written by digest alone. Short names (busybox:1.36) are refused:
each node resolves them through its own search registries.

The result is validated as imagepind reads it; nothing is printed or written unless every
reference of every file resolved and every result is valid. Exit 1 otherwise.`,
		Example: `  imagepinctl resolve app-set.yaml > app-set.resolved.yaml
  imagepinctl resolve --write sets/*.yaml
  imagepinctl resolve --name edge-apps --selector node-role.kubernetes.io/edge= images.txt > edge-apps.yaml`,
		GroupID:           "sets",
		Args:              files,
		ValidArgsFunction: setFileArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.output.check(); err != nil {
				return err
			}
			if o.write && cmd.Flags().Changed("output") {
				return fail(exitUsage, "--write rewrites each file in its own format: drop --output")
			}
			sel, err := metav1.ParseToLabelSelector(o.selector)
			if err != nil {
				return fail(exitUsage, "--selector %q: %v", o.selector, err)
			}
			cfg, err := g.loadConfig(cmd)
			if err != nil {
				return fail(exitUsage, "%v", err)
			}
			resolver := wire.Registry(cfg)
			r := resolve.NewResolver(resolver, cfg.EffectivePullConcurrency())
			return resolveFiles(cmd.Context(), r, o, sel, args, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&o.write, "write", "w", false, "rewrite each set file in place (atomically, only if something changed)")
	f.BoolVar(&o.keepTags, "keep-tags", false, "write a pinned image that named a tag as repository:tag@sha256:… (the nodes pre-load the tag too)")
	f.StringVar(&o.name, "name", "", "for a list of images: the set's name (default: the file's name without its extension)")
	f.StringVar(&o.selector, "selector", "node-role.kubernetes.io/worker=",
		`for a list of images: the set's node selector, as kubectl's -l ("" selects every node)`)
	o.output = addOutputFlag(cmd, outYAML, outJSON)
	return cmd
}

// resolved is one input file after resolution.
type resolved struct {
	path string
	file *resolve.File
	out  []byte // the new content
}

func resolveFiles(ctx context.Context, r *resolve.Resolver, o *resolveOptions, sel *metav1.LabelSelector, paths []string, stdout, stderr io.Writer) error {
	var files []*resolved
	failed := false
	for _, p := range paths {
		data, err := fsutil.ReadRegular(p, pinset.MaxSetFileSize)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", p, err)
			failed = true
			continue
		}
		f, err := resolve.Parse(p, data)
		if err != nil {
			fmt.Fprintln(stderr, err)
			failed = true
			continue
		}
		if f.ImageList && o.write {
			fmt.Fprintf(stderr, "%s: a list of images, not a set file: --write would replace it; redirect the output to a new file\n", p)
			failed = true
			continue
		}
		files = append(files, &resolved{path: p, file: f})
	}

	// Every distinct reference, looked up concurrently (the resolver bounds and dedups).
	results := map[string]resolve.Result{}
	errs := map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, f := range files {
		for _, ref := range f.file.Refs {
			mu.Lock()
			_, seen := results[ref.Image]
			if _, bad := errs[ref.Image]; seen || bad {
				mu.Unlock()
				continue
			}
			results[ref.Image] = resolve.Result{} // claimed
			mu.Unlock()
			wg.Add(1)
			go func(img string) {
				defer wg.Done()
				res, err := r.Resolve(ctx, img)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					delete(results, img)
					errs[img] = err
					return
				}
				results[img] = res
			}(ref.Image)
		}
	}
	wg.Wait()

	changed, kept := 0, 0
	for _, f := range files {
		for _, ref := range f.file.Refs {
			where := f.path + ": " + ref.Field
			if ref.Set != "" {
				where = fmt.Sprintf("%s: set %q: %s", f.path, ref.Set, ref.Field)
			}
			if err, bad := errs[ref.Image]; bad {
				fmt.Fprintf(stderr, "%s: cannot resolve: %s\n", where, oneLine(err.Error(), 800))
				failed = true
				continue
			}
			res := results[ref.Image]
			to := target(res, ref, o.keepTags)
			if to == res.From {
				kept++
				continue
			}
			changed++
			note := describe(res)
			if to != res.To {
				note = describe(resolve.Result{List: res.List, Platforms: res.Platforms, Note: "tag kept: the nodes pre-load it as this digest"})
			}
			fmt.Fprintf(stderr, "%s: %s → %s%s\n", where, res.From, to, note)
		}
		f.file.RewriteEach(func(ref resolve.Ref) string {
			if res, ok := results[ref.Image]; ok {
				return target(res, ref, o.keepTags)
			}
			return ref.Image
		})
		if err := f.render(o, sel); err != nil {
			fmt.Fprintln(stderr, err)
			failed = true
		}
	}
	fmt.Fprintf(stderr, "%d references resolved to digests, %d already by digest, %d files\n", changed, kept, len(paths))
	if failed {
		return fail(exitNo, "nothing written: fix the errors above")
	}
	return writeResolved(files, o, stdout, stderr)
}

// target is what ref is written as: its digest reference, or with keepTags and a tag
// named, repository:tag@sha256:… (never for a release image, which is by digest alone).
func target(res resolve.Result, ref resolve.Ref, keepTags bool) string {
	if keepTags && res.Tagged != "" && ref.Field != "spec.releaseImage" {
		return res.Tagged
	}
	return res.To
}

func describe(r resolve.Result) string {
	var parts []string
	if r.List {
		parts = append(parts, "manifest list: "+strings.Join(r.Platforms, ", "))
	}
	if r.Note != "" {
		parts = append(parts, r.Note)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

// render makes the file's new content and validates it as imagepind would read it.
func (f *resolved) render(o *resolveOptions, sel *metav1.LabelSelector) error {
	var err error
	if f.file.ImageList {
		name := o.name
		if name == "" {
			name = strings.TrimSuffix(filepath.Base(f.path), filepath.Ext(f.path))
		}
		var images []string
		for _, ref := range f.file.Refs {
			images = append(images, ref.Image)
		}
		f.out, err = resolve.ListDocument(name, sel, images)
	} else {
		f.out, err = f.file.Bytes()
	}
	if err != nil {
		return fmt.Errorf("%s: %w", f.path, err)
	}
	if _, err := pinset.ParseSetFile(f.path, f.out); err != nil {
		return fmt.Errorf("the result is not a valid set file: %w", err)
	}
	return nil
}

func writeResolved(files []*resolved, o *resolveOptions, stdout, stderr io.Writer) error {
	if o.write {
		for _, f := range files {
			orig, err := fsutil.ReadRegular(f.path, pinset.MaxSetFileSize)
			if err == nil && string(orig) == string(f.out) {
				continue
			}
			if err := fsutil.WriteAtomic(f.path, "", f.out, 0o644); err != nil {
				return fail(exitUsage, "%s: %v", f.path, err)
			}
			fmt.Fprintf(stderr, "%s: written\n", f.path)
		}
		return nil
	}
	if o.output.value == outJSON {
		var items []json.RawMessage
		for _, f := range files {
			docs, err := pinset.Documents(f.out)
			if err != nil {
				return fail(exitUsage, "%s: %v", f.path, err)
			}
			items = append(items, docs...)
		}
		return o.output.writeData(stdout, map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	}
	for i, f := range files {
		if i > 0 {
			fmt.Fprintln(stdout, "---")
		}
		out := f.out
		if f.file.JSON { // one YAML stream
			y, err := yaml.JSONToYAML(out)
			if err != nil {
				return fail(exitUsage, "%s: %v", f.path, err)
			}
			out = y
		}
		if _, err := stdout.Write(out); err != nil {
			return fail(exitUsage, "%v", err)
		}
	}
	return nil
}
