package crio

import (
	"bytes"
	"slices"
	"sync"
)

// FileCache remembers what CRI-O's config files said, by their content, so that a pass
// that changed nothing parses nothing: with 2000 pinned images the managed drop-in alone
// is a 150 KB TOML document, and parsing it (and rendering and re-parsing ours) on every
// pull result made imagepind's cost per image grow with the set. Reading a file and
// comparing its bytes is cheap and never stale, as a timestamp could be. A nil
// *FileCache caches nothing.
type FileCache struct {
	mu    sync.Mutex
	files map[string]cachedFile
	// The last drop-in content rendered, for the patterns it was rendered from.
	rendered         []byte
	renderedPatterns []string
}

type cachedFile struct {
	data     []byte
	setsPins bool
	pins     []string
}

// NewFileCache returns an empty cache.
func NewFileCache() *FileCache { return &FileCache{files: map[string]cachedFile{}} }

// read is readConfigFile through the cache.
func (c *FileCache) read(path string) (ConfigFile, bool) {
	if c == nil {
		return readConfigFile(path)
	}
	data, cf, exists := readConfigData(path)
	if !exists || cf.Err != nil {
		return cf, exists
	}
	c.mu.Lock()
	hit, found := c.files[path]
	c.mu.Unlock()
	if found && bytes.Equal(hit.data, data) {
		cf.SetsPins, cf.Pins = hit.setsPins, slices.Clone(hit.pins)
		return cf, true
	}
	cf = parseConfigFile(path, data)
	if cf.Err == nil {
		c.mu.Lock()
		c.files[path] = cachedFile{data: data, setsPins: cf.SetsPins, pins: slices.Clone(cf.Pins)}
		c.mu.Unlock()
	}
	return cf, true
}

// render is Render, remembered for the last patterns.
func (c *FileCache) render(patterns []string) ([]byte, error) {
	if c == nil {
		return Render(patterns)
	}
	c.mu.Lock()
	if c.rendered != nil && slices.Equal(c.renderedPatterns, patterns) {
		out := c.rendered
		c.mu.Unlock()
		return out, nil
	}
	c.mu.Unlock()
	out, err := Render(patterns)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.rendered, c.renderedPatterns = out, slices.Clone(patterns)
	c.mu.Unlock()
	return out, nil
}
