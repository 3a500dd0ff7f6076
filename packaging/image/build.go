package image

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// BinDir is where the binaries sit in the image (on PATH).
const BinDir = "usr/bin"

// Platform is one architecture of the image (the OS is always linux) and the directory
// holding its binaries.
type Platform struct {
	// Arch is a GOARCH: amd64, arm64, ppc64le, s390x.
	Arch string
	// Dir holds one file per name in Config.Binaries.
	Dir string
}

// Config is what goes into the image. The same Config with the same files gives the same
// index digest, whatever the files' own times, modes and owners.
type Config struct {
	// Platforms in the order of the index.
	Platforms []Platform
	// Binaries are file names, each taken from every platform's Dir into /usr/bin.
	Binaries []string
	// Entrypoint is the image's default command (a pod's `command` overrides it).
	Entrypoint []string
	// Created is the time of every file and of the image config (the commit's time).
	Created time.Time
	// Labels go into each platform's config (org.opencontainers.image.*).
	Labels map[string]string
}

// Sizes of one platform's image as a registry stores it.
type Sizes struct {
	Arch string
	// Compressed is the manifest, the config and the layer as pushed.
	Compressed int64
	// Uncompressed is the layer's tar.
	Uncompressed int64
}

// Write builds the image index of cfg and writes it as an OCI layout into dir, replacing
// what was there (the new layout is written beside it and renamed into place). It returns
// the index's digest.
func Write(dir string, cfg Config) (v1.Hash, error) {
	if err := cfg.validate(); err != nil {
		return v1.Hash{}, err
	}
	parent := filepath.Dir(filepath.Clean(dir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return v1.Hash{}, fmt.Errorf("image: create %s: %w", parent, err)
	}
	work, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image: %w", err)
	}
	defer os.RemoveAll(work)
	idx, err := buildIndex(cfg, work)
	if err != nil {
		return v1.Hash{}, err
	}
	out := filepath.Join(work, "layout")
	p, err := layout.Write(out, empty.Index)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image: write layout %s: %w", dir, err)
	}
	if err := p.AppendIndex(idx); err != nil {
		return v1.Hash{}, fmt.Errorf("image: write layout %s: %w", dir, err)
	}
	d, err := idx.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image: digest: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return v1.Hash{}, fmt.Errorf("image: replace %s: %w", dir, err)
	}
	if err := os.Rename(out, dir); err != nil {
		return v1.Hash{}, fmt.Errorf("image: replace %s: %w", dir, err)
	}
	return d, nil
}

func (cfg Config) validate() error {
	if len(cfg.Platforms) == 0 {
		return fmt.Errorf("image: no platform")
	}
	if len(cfg.Binaries) == 0 {
		return fmt.Errorf("image: no binary")
	}
	seen := map[string]bool{}
	for _, p := range cfg.Platforms {
		if _, ok := machines[p.Arch]; !ok {
			return fmt.Errorf("image: platform linux/%s: unknown architecture (known: amd64, arm64, ppc64le, s390x)", p.Arch)
		}
		if seen[p.Arch] {
			return fmt.Errorf("image: platform linux/%s given twice", p.Arch)
		}
		seen[p.Arch] = true
	}
	for _, b := range cfg.Binaries {
		if b == "" || b != path.Base(b) || b == "." || b == ".." {
			return fmt.Errorf("image: binary %q: a file name is needed", b)
		}
	}
	if len(cfg.Entrypoint) == 0 {
		return fmt.Errorf("image: no entrypoint")
	}
	return nil
}

// buildIndex writes each platform's layer into work and returns the index over them.
func buildIndex(cfg Config, work string) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range cfg.Platforms {
		img, err := platformImage(cfg, p, work)
		if err != nil {
			return nil, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        plainImage{img},
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: p.Arch}},
		})
	}
	return idx, nil
}

// plainImage is an image, not an artifact: its descriptor in the index has no
// artifactType (go-containerregistry would otherwise put the config's media type there).
type plainImage struct{ v1.Image }

// ArtifactType is none.
func (plainImage) ArtifactType() (string, error) { return "", nil }

func platformImage(cfg Config, p Platform, work string) (v1.Image, error) {
	gz := filepath.Join(work, "layer-"+p.Arch+".tar.gz")
	if err := writeLayer(gz, cfg, p); err != nil {
		return nil, fmt.Errorf("image: linux/%s: %w", p.Arch, err)
	}
	layer, err := tarball.LayerFromFile(gz, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image: linux/%s: layer: %w", p.Arch, err)
	}
	created := v1.Time{Time: cfg.Created.UTC()}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: created, CreatedBy: "make image", Comment: "imagepin static binaries"},
	})
	if err != nil {
		return nil, fmt.Errorf("image: linux/%s: %w", p.Arch, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image: linux/%s: config: %w", p.Arch, err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = p.Arch
	cf.Created = created
	cf.Config = v1.Config{
		Entrypoint: cfg.Entrypoint,
		Env:        []string{"PATH=/" + BinDir},
		Labels:     cfg.Labels,
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image: linux/%s: config: %w", p.Arch, err)
	}
	return img, nil
}

// entry is one file or directory of the layer.
type entry struct {
	name   string // in the tar, no leading slash; directories end in /
	mode   int64
	source string // a regular file's path on disk; "" for a directory
}

func entries(cfg Config, p Platform) []entry {
	es := []entry{
		{name: "tmp/", mode: 0o1777},
		{name: "usr/", mode: 0o755},
		{name: BinDir + "/", mode: 0o755},
	}
	for _, b := range cfg.Binaries {
		es = append(es, entry{name: BinDir + "/" + b, mode: 0o755, source: filepath.Join(p.Dir, b)})
	}
	sort.Slice(es, func(i, j int) bool { return es[i].name < es[j].name })
	return es
}

// writeLayer writes the platform's layer as a gzipped tar to gz: sorted entries, owner
// 0:0, fixed modes, every time cfg.Created.
func writeLayer(gz string, cfg Config, p Platform) (err error) {
	f, err := os.Create(gz)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	zw, err := gzip.NewWriterLevel(f, gzip.DefaultCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	mtime := cfg.Created.UTC().Truncate(time.Second)
	for _, e := range entries(cfg, p) {
		hdr := &tar.Header{Name: e.name, Mode: e.mode, ModTime: mtime, Format: tar.FormatPAX}
		if e.source == "" {
			hdr.Typeflag = tar.TypeDir
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			continue
		}
		if err := addFile(tw, hdr, e.source, p.Arch); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

func addFile(tw *tar.Writer, hdr *tar.Header, source, arch string) error {
	src, err := os.Open(source)
	if err != nil {
		return fmt.Errorf("binary: %w", err)
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return fmt.Errorf("binary: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("binary %s: not a regular file (%s)", source, fi.Mode().Type())
	}
	if err := checkELF(src, arch); err != nil {
		return fmt.Errorf("binary %s: %w", source, err)
	}
	if fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("binary %s: not executable (%s)", source, fi.Mode().Perm())
	}
	hdr.Typeflag = tar.TypeReg
	hdr.Size = fi.Size()
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.Copy(tw, io.NewSectionReader(src, 0, fi.Size()))
	if err != nil {
		return fmt.Errorf("binary %s: %w", source, err)
	}
	if n != fi.Size() {
		return fmt.Errorf("binary %s: changed while read (%d of %d bytes)", source, n, fi.Size())
	}
	return nil
}
