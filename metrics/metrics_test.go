package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/imagepin/imagepin/status"
)

func TestExposition(t *testing.T) {
	m := New()
	m.Pull("success", 1500*time.Millisecond)
	m.Pull("transient", time.Second)
	m.Reload("confirmed")
	m.Reconciled(time.Unix(1700000000, 0))
	m.Sets(status.Node{Sets: []status.Set{{Name: "upgrade", Phase: status.Pulling, ImagesTotal: 120, ImagesReady: 37, BytesReady: 1024}},
		Tags: &status.Tags{Pinned: 3, Held: 2, Moved: []status.MovedTag{{Tag: "quay.io/x/a:v1"}}}})
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	body := string(b)
	for _, want := range []string{
		`imagepin_set_images{set="upgrade"} 120`,
		`imagepin_set_images_ready{set="upgrade"} 37`,
		`imagepin_set_bytes_ready{set="upgrade"} 1024`,
		`imagepin_set_phase{phase="Pulling",set="upgrade"} 1`,
		`imagepin_set_phase{phase="Ready",set="upgrade"} 0`,
		`imagepin_pulls_total{result="success"} 1`,
		`imagepin_pull_duration_seconds_count{result="success"} 1`,
		`imagepin_reloads_total{result="confirmed"} 1`,
		`imagepin_last_reconcile_timestamp_seconds 1.7e+09`,
		`imagepin_tags{state="pinned"} 3`,
		`imagepin_tags{state="held"} 2`,
		`imagepin_tags{state="moved"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("missing %s", want)
		}
	}
	// A set that leaves leaves the metrics too.
	m.Sets(status.Node{})
	resp, _ = srv.Client().Get(srv.URL)
	b, _ = io.ReadAll(resp.Body)
	if strings.Contains(string(b), `set="upgrade"`) {
		t.Error("stale set metrics")
	}
	if !strings.Contains(string(b), `imagepin_tags{state="moved"} 0`) {
		t.Error("stale tag metrics")
	}
}
