package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"
)

// fileBlobs is the registry's blob storage: one file per digest, written by the bench
// and read by the registry (go-containerregistry's in-process registry), its size
// taken from the file (its disk handler hashes the whole blob at each request).
type fileBlobs struct{ dir string }

func (f fileBlobs) path(h v1.Hash) string { return filepath.Join(f.dir, h.Algorithm, h.Hex) }

func (f fileBlobs) Get(_ context.Context, _ string, h v1.Hash) (io.ReadCloser, error) {
	r, err := os.Open(f.path(h))
	if os.IsNotExist(err) {
		return nil, ggcr.ErrNotFound
	}
	return r, err
}

func (f fileBlobs) Stat(_ context.Context, _ string, h v1.Hash) (int64, error) {
	fi, err := os.Stat(f.path(h))
	if os.IsNotExist(err) {
		return 0, ggcr.ErrNotFound
	}
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// registry is the source registry on loopback (plain HTTP), with its blobs on disk.
type registry struct {
	host  string
	blobs fileBlobs
	srv   *http.Server
}

func startRegistry(dir string) (*registry, error) {
	blobs := fileBlobs{dir: filepath.Join(dir, "blobs")}
	if err := os.MkdirAll(filepath.Join(blobs.dir, "sha256"), 0o755); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0)), ggcr.WithBlobHandler(blobs))
	r := &registry{host: l.Addr().String(), blobs: blobs, srv: &http.Server{Handler: h}}
	go r.srv.Serve(l)
	return r, nil
}

func (r *registry) close() { r.srv.Close() }

// randomBlob writes size pseudo-random bytes (incompressible, as a compressed layer)
// into the registry's storage, streaming, and returns its descriptor.
func (r *registry) randomBlob(size int64, seed uint64) (descriptor, error) {
	tmp, err := os.CreateTemp(r.blobs.dir, "upload-")
	if err != nil {
		return descriptor{}, err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	rng := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), byte(seed >> 24), 'i', 'm', 'g'})
	buf := make([]byte, 1<<20)
	for left := size; left > 0; {
		n := min(left, int64(len(buf)))
		rng.Read(buf[:n])
		h.Write(buf[:n])
		if _, err := tmp.Write(buf[:n]); err != nil {
			tmp.Close()
			return descriptor{}, err
		}
		left -= n
	}
	if err := tmp.Close(); err != nil {
		return descriptor{}, err
	}
	d := digest.NewDigestFromEncoded(digest.SHA256, hex.EncodeToString(h.Sum(nil)))
	if err := os.Rename(tmp.Name(), filepath.Join(r.blobs.dir, "sha256", d.Encoded())); err != nil {
		return descriptor{}, err
	}
	return descriptor{MediaType: layerType, Digest: d, Size: size}, nil
}

// putBlob stores small data (a config) as a blob.
func (r *registry) putBlob(data []byte, mediaType string) (descriptor, error) {
	d := digest.FromBytes(data)
	if err := os.WriteFile(filepath.Join(r.blobs.dir, "sha256", d.Encoded()), data, 0o644); err != nil {
		return descriptor{}, err
	}
	return descriptor{MediaType: mediaType, Digest: d, Size: int64(len(data))}, nil
}

const (
	layerType    = "application/vnd.oci.image.layer.v1.tar+gzip"
	configType   = "application/vnd.oci.image.config.v1+json"
	manifestType = "application/vnd.oci.image.manifest.v1+json"
)

type descriptor struct {
	MediaType string        `json:"mediaType"`
	Digest    digest.Digest `json:"digest"`
	Size      int64         `json:"size"`
}

// image is one pushed image: its repository (path in the registry), manifest and blobs.
type image struct {
	repo     string
	manifest digest.Digest
	size     int64 // the manifest's bytes
	blobs    []descriptor
}

// push writes an OCI manifest naming a fresh config and layers to repo.
func (r *registry) push(repo string, n int, layers []descriptor) (image, error) {
	cfg, _ := json.Marshal(map[string]any{"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Labels": map[string]string{"imagepin.scalebench/image": fmt.Sprint(n)}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{}}})
	c, err := r.putBlob(cfg, configType)
	if err != nil {
		return image{}, err
	}
	man, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": manifestType, "config": c, "layers": layers})
	req, _ := http.NewRequest(http.MethodPut, "http://"+r.host+"/v2/"+repo+"/manifests/latest", bytes.NewReader(man))
	req.Header.Set("Content-Type", manifestType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return image{}, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return image{}, fmt.Errorf("push %s: %s", repo, resp.Status)
	}
	return image{repo: repo, manifest: digest.FromBytes(man), size: int64(len(man)), blobs: append([]descriptor{c}, layers...)}, nil
}

// imageRef is an image as a node pins it: by the link's address.
type imageRef struct {
	Repo     string
	Manifest digest.Digest
}

// set is what every node pins: its images, and one copy's bytes (distinct blobs and
// manifests).
type set struct {
	images   []image
	bytes    int64
	registry string // the registry's address (behind the link)
}

// makeSet pushes images × (shared base layers of baseSizes + layers of their own):
// each image on every base when perImage covers them all, else (perImage 1) image i
// on base i mod len(baseSizes).
func (r *registry) makeSet(baseSizes []int64, perImage, images, layers int, layerSize int64) (set, error) {
	s := set{registry: r.host}
	var shared []descriptor
	seed := uint64(1)
	for _, size := range baseSizes {
		d, err := r.randomBlob(size, seed)
		if err != nil {
			return s, err
		}
		seed++
		shared = append(shared, d)
		s.bytes += d.Size
	}
	for i := range images {
		var ls []descriptor
		switch {
		case len(shared) > 0 && perImage >= len(shared):
			ls = append(ls, shared...)
		case len(shared) > 0:
			ls = append(ls, shared[i%len(shared)])
		}
		for range layers {
			d, err := r.randomBlob(layerSize, seed)
			if err != nil {
				return s, err
			}
			seed++
			ls = append(ls, d)
			s.bytes += d.Size
		}
		img, err := r.push(fmt.Sprintf("scale/app-%03d", i), i, ls)
		if err != nil {
			return s, err
		}
		s.bytes += img.size + img.blobs[0].Size
		s.images = append(s.images, img)
	}
	return s, nil
}
