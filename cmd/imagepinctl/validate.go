package main

import (
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"sort"

	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/internal/fsutil"
)

func validate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.String("config", conf.DefaultConfigPath, "imagepind's config (unused by validate)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "usage: imagepinctl validate FILE...")
		return 2
	}
	files := fs.Args()
	// Name uniqueness is decided in name order, as imagepind does in its directory.
	sort.SliceStable(files, func(i, j int) bool { return filepath.Base(files[i]) < filepath.Base(files[j]) })
	failed := false
	var parsed []conf.FileSets
	for _, f := range files {
		data, err := fsutil.ReadRegular(f, conf.MaxSetFileSize)
		if err != nil {
			fmt.Fprintf(stdout, "%s: %v\n", f, err)
			failed = true
			continue
		}
		res, err := conf.ParseSetFile(f, data)
		if err != nil {
			fmt.Fprintln(stdout, err)
			failed = true
			continue
		}
		for _, w := range res.Warnings {
			fmt.Fprintf(stderr, "warning: %s\n", w)
		}
		parsed = append(parsed, conf.FileSets{File: f, Sets: res.Sets})
	}
	_, dupErrs := conf.UniqueNames(parsed)
	for _, f := range files {
		if err, ok := dupErrs[f]; ok {
			fmt.Fprintln(stdout, err)
			failed = true
		}
	}
	if failed {
		return 1
	}
	n := 0
	for _, p := range parsed {
		for _, s := range p.Sets {
			n++
			fmt.Fprintf(stderr, "%s: set %q: %d images, applies to %s\n", p.File, s.Name, len(s.Images), s.Selector)
		}
	}
	fmt.Fprintf(stderr, "%d files valid, %d sets\n", len(parsed), n)
	return 0
}
