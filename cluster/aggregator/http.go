package aggregator

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ReadHandler serves the read side: /v1/sets, /v1/sets/{name}, /v1/nodes,
// /v1/nodes/{name}, /metrics, /healthz, /readyz. It only reads. ready says whether this
// replica takes reports (the leader, with two replicas); nil: always.
func ReadHandler(store *Store, ready func() bool) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(&collector{store: store})
	mux := http.NewServeMux()
	// Set views come from a cache at most ReadFreshness old, recomputed beside the
	// readers (readcache.go).
	views := newReadCache(store.now, func(key string) ([]byte, bool) {
		key, all := strings.CutPrefix(key, "all/")
		if key == "" {
			if all {
				return encodeJSON(store.Sets()), true
			}
			return encodeJSON(store.SetsSummary()), true
		}
		v, ok := store.Set(strings.TrimPrefix(key, "set/"), all)
		return encodeJSON(v), ok
	})
	serve := func(w http.ResponseWriter, r *http.Request, key string) {
		if allNodes(r) {
			key = "all/" + key
		}
		body, ok := views.get(key)
		if !ok {
			http.Error(w, "no node reports set "+r.PathValue("name"), http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}
	// ?nodes=all lists every node; by default only those that are not Ready (the counts
	// always cover all), which keeps answers small at thousands of nodes.
	mux.HandleFunc("GET /v1/sets", func(w http.ResponseWriter, r *http.Request) { serve(w, r, "") })
	mux.HandleFunc("GET /v1/sets/{name}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") == "" {
			http.NotFound(w, r)
			return
		}
		serve(w, r, "set/"+r.PathValue("name"))
	})
	mux.HandleFunc("GET /v1/nodes", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, store.Nodes()) })
	mux.HandleFunc("GET /v1/nodes/{name}", func(w http.ResponseWriter, r *http.Request) {
		n, v, ok := store.Node(r.PathValue("name"))
		if !ok {
			http.Error(w, "unknown node "+r.PathValue("name"), http.StatusNotFound)
			return
		}
		writeJSON(w, struct {
			NodeView
			Report any `json:"report,omitempty"`
		}{v, reportOrNil(n.Node.Name != "", n)})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
	// Readiness: only the replica that takes reports is behind the Service's endpoints.
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if ready != nil && !ready() {
			http.Error(w, "standing by (not the leader)", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /{$}", statusPage(store, 10*time.Second))
	return mux
}

func allNodes(r *http.Request) bool { return r.URL.Query().Get("nodes") == "all" }

func reportOrNil(ok bool, v any) any {
	if !ok {
		return nil
	}
	return v
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// ReadExpectedNodes parses an expected-nodes file: one node name a line, # comments.
func ReadExpectedNodes(data []byte) []string {
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		if line != "" {
			out = append(out, line)
		}
	}
	return out
}
