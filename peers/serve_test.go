package peers

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

// Requests for one manifest share its slot, as a blob's do: the head of a manifest's
// order, which every node asks, serves them all while it fetches the manifest and
// turns none away (with a slot a request, it served max_serving of them and answered
// 503 to the rest, which asked again every pinPoll: at 500 nodes, peers busy for a
// whole minute, set aside). Another manifest, every slot taken, still waits slotWait
// and gets a 503.
func TestRequestsForOneManifestShareItsSlot(t *testing.T) {
	old := slotWait
	slotWait = 100 * time.Millisecond
	t.Cleanup(func() { slotWait = old })
	node := c0(t)
	release := make(chan struct{})
	s := &Server{Mirror: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release // fetching the manifest
		w.Write([]byte("{}"))
	}), MaxServing: 1, Stats: &Stats{}}
	serve := func(d digest.Digest) int {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/v2/ocp/release/manifests/"+d.String(), nil)
		req.TLS = node
		s.ServeHTTP(rec, req)
		return rec.Code
	}
	const asking = 20
	codes := make(chan int, asking)
	for range asking {
		go func() { codes <- serve(digest.FromString("a")) }()
	}
	time.Sleep(3 * slotWait) // each waits longer than slotWait for its answer
	if code := serve(digest.FromString("b")); code != http.StatusServiceUnavailable {
		t.Errorf("another manifest, the one slot taken: %d, want 503", code)
	}
	close(release)
	for range asking {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("a request for the manifest being served: %d, want 200", code)
		}
	}
}
