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

// The page says per set whether it is ready to lose the registry, and apart: on how
// many nodes pods start without it, the Ready nodes where pods would need it when they
// start (not a node whose own pods start), the blobs held by too few nodes and who
// would fail to join; and the bytes fetched from registries.
func TestPageShowsRegistryGone(t *testing.T) {
	store := NewStore(DefaultLimits(), time.Now)
	store.started = time.Now().Add(-HoldersWarmup) // nodes had time to report
	independent := []status.Condition{{Type: status.ConditionRegistryIndependent, Status: status.True, Reason: status.ReasonPodsStartWithoutRegistry},
		{Type: status.ConditionPodsStartWithoutRegistry, Status: status.True, Reason: status.ReasonImagesHeld}}
	// w1's own pods start; only the count of holders stands in its way.
	stranded := []status.Condition{{Type: status.ConditionRegistryIndependent, Status: status.False, Reason: status.ReasonBlobsNotHeld, Message: "held by w1 only"},
		{Type: status.ConditionPodsStartWithoutRegistry, Status: status.True, Reason: status.ReasonImagesHeld}}
	dependent := []status.Condition{{Type: status.ConditionRegistryIndependent, Status: status.False, Reason: "CredentialVerification", Message: "the kubelet asks the registry first"},
		{Type: status.ConditionPodsStartWithoutRegistry, Status: status.False, Reason: "CredentialVerification", Message: "the kubelet asks the registry first"}}
	for node, sets := range map[string][]status.Set{
		"w1": {{Name: "apps", Phase: status.Ready, ImagesTotal: 1, ImagesReady: 1, BytesFromRegistry: 5 << 20, Conditions: stranded},
			{Name: "tools", Phase: status.Ready, ImagesTotal: 1, ImagesReady: 1, Conditions: independent}},
		"w2": {{Name: "apps", Phase: status.Ready, ImagesTotal: 1, ImagesReady: 1, Conditions: dependent},
			{Name: "tools", Phase: status.Ready, ImagesTotal: 1, ImagesReady: 1, Conditions: independent}},
	} {
		// Both share the blob of tools' image; apps' is w1's alone.
		n := status.Node{Node: status.NodeInfo{Name: node, Peers: &status.PeerBytes{Address: node + ":7444"}}, Sets: sets, Blobs: []status.ImageBlobs{
			{Image: "reg.example/a@sha256:" + strings.Repeat("a", 64), Sets: []string{"apps"}, Blobs: []status.Blob{{Digest: "sha256:" + strings.Repeat("1", 64), Size: 1, Held: node == "w1"}}},
			{Image: "reg.example/t@sha256:" + strings.Repeat("b", 64), Sets: []string{"tools"}, Blobs: []status.Blob{{Digest: "sha256:" + strings.Repeat("2", 64), Size: 1, Held: true}}},
		}}
		if _, err := store.Ingest(node, v1.FromStatus(n, "b", 1, time.Minute)); err != nil {
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
	for _, want := range []string{`<span class="badge notready">no</span>`, "pods start without the registry on 1 of 2 nodes",
		"w2</td><td>Ready, would need the registry when a pod starts: CredentialVerification</td><td>the kubelet asks the registry first",
		"5.0 MiB fetched from registries", "blobs, for a node joining or replacing one: 1 of the 1 blobs of the images are held by fewer than 2 nodes",
		"sha256:" + strings.Repeat("1", 64) + " (1 B, of reg.example/a@sha256:" + strings.Repeat("a", 64) + ") is held by w1 only"} {
		if !strings.Contains(apps, want) {
			t.Errorf("apps lacks %q:\n%s", want, apps)
		}
	}
	if strings.Contains(apps, "w1</td>") {
		t.Errorf("apps names w1, whose own pods start:\n%s", apps)
	}
	if !strings.Contains(tools, `<span class="badge ready">yes</span>`) || !strings.Contains(tools, "pods start without the registry on all 2 nodes") ||
		!strings.Contains(tools, "blobs, for a node joining or replacing one: each of the 1 blobs of its images held by 2 nodes or more") ||
		strings.Contains(tools, "would need the registry") || strings.Contains(tools, "fetched from registries") {
		t.Errorf("tools:\n%s", tools)
	}
}
