package registry

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"

	"github.com/opencontainers/go-digest"
)

// The uncompressed sizes learned are kept in Config.SizeCache (the daemon's state
// directory), so that a restart does not ask them again: a layer is named by its
// digest, and what a digest holds never changes. Only sizes learned are kept (an
// unknown one may be learned next time); the file holds at most maxSizeCache of them.
// A file that cannot be read or parsed is an empty cache, and entries that do not look
// right are dropped.

const maxSizeCache = 100_000

type sizeCacheFile struct {
	Version int                      `json:"version"`
	Sizes   map[string]sizeCacheItem `json:"sizes"`
}

type sizeCacheItem struct {
	Size int64  `json:"size"`
	From string `json:"from"`
}

// loadSizes reads the size cache file into usize (r.mu not needed: called by New).
func (r *Client) loadSizes() {
	if r.cfg.SizeCache == "" {
		return
	}
	b, err := os.ReadFile(r.cfg.SizeCache)
	if err != nil {
		return
	}
	var f sizeCacheFile
	if json.Unmarshal(b, &f) != nil || f.Version != 1 {
		return
	}
	for d, it := range f.Sizes {
		if len(r.usize) >= maxSizeCache {
			break
		}
		if digest.Digest(d).Validate() != nil || it.Size <= 0 || it.Size > MaxLayerSize ||
			(it.From != FromGzipTrailer && it.From != FromZstdHeader && it.From != FromTar) {
			continue
		}
		r.usize[d] = layerSize{size: it.Size, from: it.From}
	}
}

// saveSizes writes the sizes learned to the size cache file when some are new since it
// was last written: atomically (a temporary file beside it, renamed over it).
func (r *Client) saveSizes() error {
	if r.cfg.SizeCache == "" {
		return nil
	}
	r.mu.Lock()
	if !r.sizesDirty {
		r.mu.Unlock()
		return nil
	}
	f := sizeCacheFile{Version: 1, Sizes: map[string]sizeCacheItem{}}
	for d, u := range r.usize {
		if u.from == "" || len(f.Sizes) >= maxSizeCache {
			continue
		}
		f.Sizes[d] = sizeCacheItem{Size: u.size, From: u.from}
	}
	r.sizesDirty = false
	r.mu.Unlock()
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	dir := filepath.Dir(r.cfg.SizeCache)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(r.cfg.SizeCache)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), r.cfg.SizeCache)
}

// sizeCacheName is the size cache file's name in the daemon's state directory.
const sizeCacheName = "layer-sizes.json"

// SizeCacheIn is the size cache file of the state directory dir.
func SizeCacheIn(dir string) string {
	return filepath.Join(strings.TrimSuffix(dir, "/"), sizeCacheName)
}
