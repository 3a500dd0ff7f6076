package aggregator

import (
	"bytes"
	"embed"
	"fmt"
	"html"
	"html/template"
	"net/http"
	"time"

	"github.com/imagepin/imagepin/internal/bytesize"
	"github.com/imagepin/imagepin/status"
)

//go:embed templates/*.html
var templates embed.FS

var pageTemplate = template.Must(template.ParseFS(templates, "templates/status.html"))

// MaxCellsPerSet bounds a set's grid: beyond it only nodes that are not Ready get a
// cell (the others are counted), so the page stays readable at thousands of nodes.
const MaxCellsPerSet = 300

type pageSet struct {
	SetView
	Percent int
	ETA     string
	// FromRegistry is BytesFromRegistry, readable ("" none).
	FromRegistry string
	Cells        []SetNode
	Hidden       int
	Failures     []SetNode
	// Blobs says whether every blob of the set's images has enough holders for a node
	// joining or replacing one, or which have not and who would fail.
	Blobs string
}

type pageData struct {
	Now       string
	Refresh   int
	Sets      []pageSet
	Nodes     []NodeView
	ReadySets int
}

// statusPage serves the sets × nodes page: each cell's phase and progress, failures
// with their messages, each set's ETA. No JavaScript; it refreshes itself. The page is
// cached as the JSON views are (readcache.go): rendering it is O(nodes × sets), 662 ms
// at 5,000 nodes × 10 sets, and readers never wait for it but the first.
func statusPage(store *Store, refresh time.Duration) http.HandlerFunc {
	page := newReadCache(store.now, func(string) ([]byte, bool) {
		var b bytes.Buffer
		if err := pageTemplate.Execute(&b, pageFor(store, refresh)); err != nil {
			return []byte(html.EscapeString(err.Error())), false
		}
		return b.Bytes(), true
	})
	return func(w http.ResponseWriter, r *http.Request) {
		body, ok := page.get("page")
		if !ok {
			http.Error(w, string(body), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write(body)
	}
}

// pageFor is the page's data now.
func pageFor(store *Store, refresh time.Duration) pageData {
	sets := store.Sets()
	data := pageData{Now: time.Now().UTC().Format("2006-01-02 15:04:05 UTC"), Refresh: int(refresh / time.Second), Nodes: store.Nodes()}
	for _, s := range sets {
		ps := pageSet{SetView: s}
		if s.Ready {
			data.ReadySets++
		}
		done, total := float64(s.BytesReady), float64(s.BytesTotal)
		if total == 0 {
			done, total = float64(s.ImagesReady), float64(s.ImagesTotal)
		}
		if total > 0 {
			ps.Percent = int(100 * done / total)
		}
		if s.BytesFromRegistry > 0 {
			ps.FromRegistry = bytesize.Human(uint64(s.BytesFromRegistry))
		}
		ps.Blobs = s.BlobHolders.Why()
		if s.BlobHolders.Status == status.True {
			ps.Blobs = fmt.Sprintf("each of the %d blobs of its images held by %d nodes or more: it gets them from its peers", s.BlobHolders.Blobs, status.MinBlobHolders)
		}
		if s.ETASeconds != nil {
			ps.ETA = (time.Duration(*s.ETASeconds) * time.Second).Round(time.Second).String()
		}
		for _, n := range s.Nodes {
			if n.Phase == "Failed" || n.Phase == PhaseUnknown {
				ps.Failures = append(ps.Failures, n)
			}
			if len(s.Nodes) > MaxCellsPerSet && n.Phase == "Ready" {
				ps.Hidden++
				continue
			}
			ps.Cells = append(ps.Cells, n)
		}
		data.Sets = append(data.Sets, ps)
	}
	return data
}
