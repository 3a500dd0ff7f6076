package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestMirrorBytes(t *testing.T) {
	m := New()
	m.MirrorBytes(func() int64 { return 1234 }, func() int64 { return 56 })
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{`imagepin_mirror_served_bytes_total{from="store"} 1234`, `imagepin_mirror_served_bytes_total{from="transfer"} 56`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("no %q in\n%s", want, body)
		}
	}
}
