package main

import (
	"fmt"
	"io"
	"path/filepath"
	"sort"

	"github.com/spf13/cobra"

	"github.com/imagepin/imagepin/internal/fsutil"
	"github.com/imagepin/imagepin/pinset"
)

func newValidate(*globals) *cobra.Command {
	return &cobra.Command{
		Use:   "validate FILE...",
		Short: "Check PinnedImageSet files as imagepind reads them",
		Long: `Check PinnedImageSet files (YAML or JSON, one or many documents, a List) exactly as
imagepind reads its sets directory: the shape, every field, digest-only and fully
qualified image references, the limits, and set names unique across the files (decided
in file name order, as in the directory).

Each error is one line on stdout, "FILE: document N: set NAME: FIELD: what is wrong and
how to fix it"; the summary goes to stderr, with a warning for each set that targets no
node (no spec.nodeSelector and no role label: imagepind applies it nowhere;
nodeSelector: {} selects every node). Exit 0 when every file is valid, warnings or not;
1 if not.`,
		Example: `  imagepinctl validate /etc/imagepin/sets.d/*.yaml
  kubectl get pinnedimagesets -o yaml > all.yaml && imagepinctl validate all.yaml`,
		GroupID:           "sets",
		Args:              files,
		ValidArgsFunction: setFileArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return exit(validate(args, cmd.OutOrStdout(), cmd.ErrOrStderr()))
		},
	}
}

func validate(files []string, stdout, stderr io.Writer) int {
	// Name uniqueness is decided in name order, as imagepind does in its directory.
	sort.SliceStable(files, func(i, j int) bool { return filepath.Base(files[i]) < filepath.Base(files[j]) })
	failed := false
	var parsed []pinset.FileSets
	for _, f := range files {
		data, err := fsutil.ReadRegular(f, pinset.MaxSetFileSize)
		if err != nil {
			fmt.Fprintf(stdout, "%s: %v\n", f, err)
			failed = true
			continue
		}
		res, err := pinset.ParseSetFile(f, data)
		if err != nil {
			fmt.Fprintln(stdout, err)
			failed = true
			continue
		}
		for _, w := range res.Warnings {
			fmt.Fprintf(stderr, "warning: %s\n", w)
		}
		parsed = append(parsed, pinset.FileSets{File: f, Sets: res.Sets})
	}
	_, dupErrs := pinset.UniqueNames(parsed)
	for _, f := range files {
		if err, ok := dupErrs[f]; ok {
			fmt.Fprintln(stdout, err)
			failed = true
		}
	}
	if failed {
		return exitNo
	}
	n, nowhere := 0, 0
	for _, p := range parsed {
		for _, s := range p.Sets {
			n++
			if why, ok := s.Selector.SelectsNoNode(); ok {
				nowhere++
				fmt.Fprintf(stderr, "%s: set %q: %d images, applies to NO node (%s)\n", p.File, s.Name, len(s.Images), why)
				continue
			}
			fmt.Fprintf(stderr, "%s: set %q: %d images, applies to %s\n", p.File, s.Name, len(s.Images), s.Selector)
		}
	}
	fmt.Fprintf(stderr, "%d files valid, %d sets", len(parsed), n)
	if nowhere > 0 {
		fmt.Fprintf(stderr, ", %d targeting no node (imagepind applies them nowhere)", nowhere)
	}
	fmt.Fprintln(stderr)
	return exitOK
}
