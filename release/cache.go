package release

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// Cached expands each release once: in memory, and in a directory (imagepind's state) so
// that a restart does not fetch it again. A release image by digest never changes.
type Cached struct {
	Dir    string
	Source Source

	mu  sync.Mutex
	mem map[string]Release
}

// Expand returns the release, from the cache when it can.
func (c *Cached) Expand(ctx context.Context, pullSpec string) (Release, error) {
	c.mu.Lock()
	if r, ok := c.mem[pullSpec]; ok {
		c.mu.Unlock()
		return r, nil
	}
	c.mu.Unlock()
	file := filepath.Join(c.Dir, key(pullSpec)+".json")
	if data, err := fsutil.ReadRegular(file, 64<<20); err == nil {
		var r Release
		if json.Unmarshal(data, &r) == nil && r.Image == pullSpec {
			c.remember(r)
			return r, nil
		}
	}
	r, err := Expand(ctx, c.Source, pullSpec)
	if err != nil {
		return Release{}, err
	}
	if data, err := json.Marshal(r); err == nil {
		if os.MkdirAll(c.Dir, 0o700) == nil {
			_ = fsutil.WriteAtomic(file, "", data, 0o600)
		}
	}
	c.remember(r)
	return r, nil
}

func (c *Cached) remember(r Release) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mem == nil {
		c.mem = map[string]Release{}
	}
	c.mem[r.Image] = r
}

func key(pullSpec string) string {
	h := sha256.Sum256([]byte(pullSpec))
	return hex.EncodeToString(h[:16])
}
