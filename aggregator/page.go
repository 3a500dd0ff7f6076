package aggregator

import (
	"embed"
	"html/template"
	"net/http"
	"time"
)

//go:embed templates/*.html
var templates embed.FS

var pageTemplate = template.Must(template.ParseFS(templates, "templates/status.html"))

// MaxCellsPerSet bounds a set's grid: beyond it only nodes that are not Ready get a
// cell (the others are counted), so the page stays readable at thousands of nodes.
const MaxCellsPerSet = 300

type pageSet struct {
	SetView
	Percent  int
	ETA      string
	Cells    []SetNode
	Hidden   int
	Failures []SetNode
}

type pageData struct {
	Now       string
	Refresh   int
	Sets      []pageSet
	Nodes     []NodeView
	ReadySets int
}

// statusPage renders the sets × nodes page: each cell's phase and progress, failures
// with their messages, each set's ETA. No JavaScript; it refreshes itself.
func statusPage(store *Store, refresh time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
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
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if err := pageTemplate.Execute(w, data); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}
}
