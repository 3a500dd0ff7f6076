package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// maxBinary bounds a binary read back from a layer.
const maxBinary = 512 << 20

// Index is the image index an OCI layout written by Write holds (the one entry of its
// index.json): what a registry is given.
func Index(dir string) (v1.ImageIndex, error) {
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("image: read layout %s: %w", dir, err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("image: read layout %s: index.json: %w", dir, err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].MediaType != types.OCIImageIndex {
		return nil, fmt.Errorf("image: layout %s: index.json: want one entry, an image index; have %d entries", dir, len(m.Manifests))
	}
	idx, err := top.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		return nil, fmt.Errorf("image: layout %s: %w", dir, err)
	}
	return idx, nil
}

// Verify reads the layout in dir back and checks that its index has one manifest per arch,
// in that order, each for linux and that architecture (in the index and in its config),
// with an entrypoint under /usr/bin, and a layer whose bytes match its digests and that
// holds every binary as a regular file, executable, owned by 0:0, a static ELF executable
// for that architecture. It returns each platform's sizes.
func Verify(dir string, arches, binaries []string) ([]Sizes, error) {
	idx, err := Index(dir)
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("image: %s: index: %w", dir, err)
	}
	if len(im.Manifests) != len(arches) {
		return nil, fmt.Errorf("image: %s: index has %d manifests, want %d (%v)", dir, len(im.Manifests), len(arches), arches)
	}
	var sizes []Sizes
	for i, desc := range im.Manifests {
		arch := arches[i]
		s, err := verifyPlatform(idx, desc, arch, binaries)
		if err != nil {
			return nil, fmt.Errorf("image: %s: manifest %d (%s), want linux/%s: %w", dir, i, desc.Digest, arch, err)
		}
		sizes = append(sizes, s)
	}
	return sizes, nil
}

func verifyPlatform(idx v1.ImageIndex, desc v1.Descriptor, arch string, binaries []string) (Sizes, error) {
	s := Sizes{Arch: arch, Compressed: desc.Size}
	if desc.MediaType != types.OCIManifestSchema1 || desc.ArtifactType != "" {
		return s, fmt.Errorf("media type %s artifactType %q, want an image: %s, no artifactType", desc.MediaType, desc.ArtifactType, types.OCIManifestSchema1)
	}
	if desc.Platform == nil || desc.Platform.OS != "linux" || desc.Platform.Architecture != arch {
		return s, fmt.Errorf("index platform %v, want linux/%s", desc.Platform, arch)
	}
	img, err := idx.Image(desc.Digest)
	if err != nil {
		return s, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return s, fmt.Errorf("config: %w", err)
	}
	if cf.OS != "linux" || cf.Architecture != arch {
		return s, fmt.Errorf("config platform %s/%s, want linux/%s", cf.OS, cf.Architecture, arch)
	}
	m, err := img.Manifest()
	if err != nil {
		return s, fmt.Errorf("manifest: %w", err)
	}
	s.Compressed += m.Config.Size
	if len(m.Layers) != 1 || len(cf.RootFS.DiffIDs) != 1 {
		return s, fmt.Errorf("%d layers (%d diff IDs), want 1", len(m.Layers), len(cf.RootFS.DiffIDs))
	}
	ep := cf.Config.Entrypoint
	if len(ep) == 0 || path.Dir(ep[0]) != "/"+BinDir || !slices.Contains(binaries, path.Base(ep[0])) {
		return s, fmt.Errorf("entrypoint %q is none of the binaries in /%s", ep, BinDir)
	}
	l := m.Layers[0]
	s.Compressed += l.Size
	layer, err := img.LayerByDigest(l.Digest)
	if err != nil {
		return s, fmt.Errorf("layer %s: %w", l.Digest, err)
	}
	rc, err := layer.Compressed()
	if err != nil {
		return s, fmt.Errorf("layer %s: %w", l.Digest, err)
	}
	defer rc.Close()
	n, err := verifyLayer(rc, l, cf.RootFS.DiffIDs[0], arch, binaries)
	s.Uncompressed = n
	if err != nil {
		return s, fmt.Errorf("layer %s: %w", l.Digest, err)
	}
	return s, nil
}

type countingHash struct {
	n int64
	h hashWriter
}

type hashWriter interface {
	io.Writer
	Sum([]byte) []byte
}

func (c *countingHash) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.h.Write(p)
}

func (c *countingHash) check(what string, size int64, want v1.Hash) error {
	got := "sha256:" + hex.EncodeToString(c.h.Sum(nil))
	if size >= 0 && c.n != size {
		return fmt.Errorf("%s: %d bytes, the descriptor says %d", what, c.n, size)
	}
	if got != want.String() {
		return fmt.Errorf("%s: content is %s, want %s", what, got, want)
	}
	return nil
}

// verifyLayer reads the gzipped tar once: its digest, its diff ID and its entries. It
// returns the tar's size.
func verifyLayer(r io.Reader, desc v1.Descriptor, diffID v1.Hash, arch string, binaries []string) (int64, error) {
	if desc.MediaType != types.OCILayer {
		return 0, fmt.Errorf("media type %s, want %s", desc.MediaType, types.OCILayer)
	}
	zsum := &countingHash{h: sha256.New()}
	zr, err := gzip.NewReader(io.TeeReader(r, zsum))
	if err != nil {
		return 0, fmt.Errorf("gzip: %w", err)
	}
	tsum := &countingHash{h: sha256.New()}
	tr := tar.NewReader(io.TeeReader(zr, tsum))
	found := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return tsum.n, fmt.Errorf("tar: %w", err)
		}
		if hdr.Uid != 0 || hdr.Gid != 0 {
			return tsum.n, fmt.Errorf("%s: owner %d:%d, want 0:0", hdr.Name, hdr.Uid, hdr.Gid)
		}
		b, ok := binaryName(hdr.Name, binaries)
		if !ok {
			continue
		}
		if hdr.Typeflag != tar.TypeReg {
			return tsum.n, fmt.Errorf("%s: not a regular file (type %q)", hdr.Name, hdr.Typeflag)
		}
		if hdr.Mode&0o111 != 0o111 {
			return tsum.n, fmt.Errorf("%s: mode %#o, not executable by all", hdr.Name, hdr.Mode)
		}
		data, err := io.ReadAll(io.LimitReader(tr, maxBinary+1))
		if err != nil {
			return tsum.n, fmt.Errorf("%s: %w", hdr.Name, err)
		}
		if len(data) > maxBinary {
			return tsum.n, fmt.Errorf("%s: over %d bytes", hdr.Name, maxBinary)
		}
		if err := checkELF(bytes.NewReader(data), arch); err != nil {
			return tsum.n, fmt.Errorf("%s: %w", hdr.Name, err)
		}
		found[b] = true
	}
	// The rest of the gzip stream (tar's padding), so the digest covers every byte.
	if _, err := io.Copy(io.Discard, zr); err != nil {
		return tsum.n, fmt.Errorf("gzip: %w", err)
	}
	if _, err := io.Copy(io.Discard, r); err != nil {
		return tsum.n, err
	}
	for _, b := range binaries {
		if !found[b] {
			return tsum.n, fmt.Errorf("/%s/%s missing", BinDir, b)
		}
	}
	if err := zsum.check("compressed", desc.Size, desc.Digest); err != nil {
		return tsum.n, err
	}
	if err := tsum.check("uncompressed", -1, diffID); err != nil {
		return tsum.n, err
	}
	return tsum.n, nil
}

func binaryName(name string, binaries []string) (string, bool) {
	name = path.Clean("/" + name)
	if path.Dir(name) != "/"+BinDir {
		return "", false
	}
	b := path.Base(name)
	return b, slices.Contains(binaries, b)
}
