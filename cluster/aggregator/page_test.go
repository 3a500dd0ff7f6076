package aggregator

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
	"github.com/imagepin/imagepin/status"
)

// The page says per set whether its pods start with the registry gone, names the Ready
// nodes that would still need it, and shows the bytes fetched from registries.
func TestPageShowsRegistryGone(t *testing.T) {
	store := NewStore(DefaultLimits(), time.Now)
	independent := status.Condition{Type: status.ConditionRegistryIndependent, Status: status.True, Reason: "PreloadedImagesStart"}
	dependent := status.Condition{Type: status.ConditionRegistryIndependent, Status: status.False, Reason: "CredentialVerification",
		Message: "the kubelet asks the registry first"}
	for node, sets := range map[string][]status.Set{
		"w1": {{Name: "apps", Phase: status.Ready, ImagesTotal: 1, ImagesReady: 1, BytesFromRegistry: 5 << 20, Conditions: []status.Condition{independent}},
			{Name: "tools", Phase: status.Ready, ImagesTotal: 1, ImagesReady: 1, Conditions: []status.Condition{independent}}},
		"w2": {{Name: "apps", Phase: status.Ready, ImagesTotal: 1, ImagesReady: 1, Conditions: []status.Condition{dependent}},
			{Name: "tools", Phase: status.Ready, ImagesTotal: 1, ImagesReady: 1, Conditions: []status.Condition{independent}}},
	} {
		if _, err := store.Ingest(node, v1.FromStatus(status.Node{Node: status.NodeInfo{Name: node}, Sets: sets}, "b", 1, time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(ReadHandler(store, nil))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	page := string(b)
	section := func(set string) string {
		i := strings.Index(page, `id="set-`+set+`"`)
		if i < 0 {
			t.Fatalf("no section for %s:\n%s", set, page)
		}
		rest := page[i:]
		if j := strings.Index(rest, "</section>"); j > 0 {
			rest = rest[:j]
		}
		return rest
	}
	apps, tools := section("apps"), section("tools")
	for _, want := range []string{"pods start on 1 of 2 nodes", "w2</td><td>Ready, would need the registry: CredentialVerification</td><td>the kubelet asks the registry first",
		"5.0 MiB fetched from registries"} {
		if !strings.Contains(apps, want) {
			t.Errorf("apps lacks %q:\n%s", want, apps)
		}
	}
	if !strings.Contains(tools, "pods start on all 2 nodes") || strings.Contains(tools, "would need the registry") || strings.Contains(tools, "fetched from registries") {
		t.Errorf("tools:\n%s", tools)
	}
}
