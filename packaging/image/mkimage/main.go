// Command mkimage is `make image`: imagepin's image from the static binaries built for
// each architecture (BIN/linux-<arch>/), written as an OCI layout, read back and checked,
// then its digest and each platform's sizes printed.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/imagepin/imagepin/internal/bytesize"
	"github.com/imagepin/imagepin/packaging/image"
)

// binaries go into every platform; the first is the entrypoint.
var binaries = []string{"imagepind", "imagepinctl", "imagepin-aggregator"}

type options struct {
	bin, out, arches, version, revision, source, epoch string
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin/image", "directory holding linux-<arch>/ with the binaries")
	flag.StringVar(&o.out, "out", "_output/image", "OCI layout directory to write (replaced)")
	flag.StringVar(&o.arches, "arches", "amd64,arm64,ppc64le,s390x", "architectures, in the index's order")
	flag.StringVar(&o.version, "version", "", "org.opencontainers.image.version")
	flag.StringVar(&o.revision, "revision", "", "org.opencontainers.image.revision (the commit)")
	flag.StringVar(&o.source, "source", "https://github.com/imagepin/imagepin", "org.opencontainers.image.source")
	flag.StringVar(&o.epoch, "epoch", os.Getenv("SOURCE_DATE_EPOCH"), "the image's time in seconds since 1970 (the commit's time; default $SOURCE_DATE_EPOCH, else 0)")
	flag.Parse()
	if err := run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(o options, stdout io.Writer) error {
	secs := int64(0)
	if o.epoch != "" {
		var err error
		if secs, err = strconv.ParseInt(o.epoch, 10, 64); err != nil || secs < 0 {
			return fmt.Errorf("-epoch %q: want whole seconds since 1970", o.epoch)
		}
	}
	arches := strings.Split(o.arches, ",")
	cfg := image.Config{
		Binaries:   binaries,
		Entrypoint: []string{"/" + image.BinDir + "/" + binaries[0]},
		Created:    time.Unix(secs, 0).UTC(),
		Labels:     map[string]string{},
	}
	for _, a := range arches {
		cfg.Platforms = append(cfg.Platforms, image.Platform{Arch: a, Dir: filepath.Join(o.bin, "linux-"+a)})
	}
	for k, v := range map[string]string{"source": o.source, "revision": o.revision, "version": o.version} {
		if v != "" {
			cfg.Labels["org.opencontainers.image."+k] = v
		}
	}
	d, err := image.Write(o.out, cfg)
	if err != nil {
		return err
	}
	sizes, err := image.Verify(o.out, arches, binaries)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: image index %s\n", o.out, d)
	for _, s := range sizes {
		fmt.Fprintf(stdout, "  linux/%-8s %s compressed, %s uncompressed\n", s.Arch, bytesize.Human(uint64(s.Compressed)), bytesize.Human(uint64(s.Uncompressed)))
	}
	return nil
}
