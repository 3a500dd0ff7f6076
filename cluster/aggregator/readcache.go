package aggregator

import (
	"bytes"
	"encoding/json"
	"sync"
	"time"
)

// ReadFreshness is how old a set view served by the read API may be. Views are computed
// from every node's report (O(nodes)); under thousands of reports a second a reader
// waiting for that is slow, so a view older than this is served as it is while one
// recomputation runs beside it: no reader waits for a rollup but the very first of a
// view, and what a reader gets is at most this old plus one rollup.
const ReadFreshness = 250 * time.Millisecond

// readCache holds the encoded views the read API serves, by key ("" for every set,
// "set/NAME" for one, "all/…" with every node listed).
type readCache struct {
	now     func() time.Time
	compute func(key string) ([]byte, bool)

	mu      sync.Mutex
	entries map[string]*cachedView
}

type cachedView struct {
	body     []byte
	found    bool
	at       time.Time
	updating bool
}

func newReadCache(now func() time.Time, compute func(key string) ([]byte, bool)) *readCache {
	return &readCache{now: now, compute: compute, entries: map[string]*cachedView{}}
}

// get returns the view for key: cached, or computed now when there is none; a stale one
// is returned at once and recomputed beside.
func (c *readCache) get(key string) ([]byte, bool) {
	c.mu.Lock()
	e := c.entries[key]
	if e != nil {
		if !e.updating && c.now().Sub(e.at) > ReadFreshness {
			e.updating = true
			go c.refresh(key)
		}
		body, found := e.body, e.found
		c.mu.Unlock()
		return body, found
	}
	c.mu.Unlock()
	body, found := c.compute(key)
	c.mu.Lock()
	if c.entries[key] == nil {
		c.entries[key] = &cachedView{body: body, found: found, at: c.now()}
	}
	if len(c.entries) > 1024 { // many names asked once: forget them all
		c.entries = map[string]*cachedView{key: c.entries[key]}
	}
	c.mu.Unlock()
	return body, found
}

func (c *readCache) refresh(key string) {
	body, found := c.compute(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries[key] = &cachedView{body: body, found: found, at: c.now()}
}

func encodeJSON(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	enc.Encode(v)
	return b.Bytes()
}
