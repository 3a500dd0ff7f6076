package aggregator

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
	"github.com/imagepin/imagepin/status"
)

const appImage = "reg.example/shop/app@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

// blob is a digest of sixty-four c's.
func blob(c string) string { return "sha256:" + strings.Repeat(c, 64) }

// appBlobs are app's five blobs (manifest, config, three layers); held names those the
// node holds, seeded those a seed holds.
func appBlobs(held, seeded string) status.ImageBlobs {
	img := status.ImageBlobs{Image: appImage, Sets: []string{"app"}}
	for i, c := range []string{"0", "1", "2", "3", "4"} {
		img.Blobs = append(img.Blobs, status.Blob{Digest: blob(c), Size: int64(1+i) << 20, Held: strings.Contains(held, c), Seeded: strings.Contains(seeded, c)})
	}
	return img
}

// blobsReport is node's report of set app, Ready, its own pods starting without the
// registry (PodsStartWithoutRegistry True) while its RegistryIndependent waits for the
// count of holders, sharing from address ("": sharing nothing), with its blobs.
func blobsReport(node, address string, seq uint64, images ...status.ImageBlobs) *v1.NodeReport {
	n := status.Node{Node: status.NodeInfo{Name: node}, Blobs: images}
	if address != "" {
		n.Node.Peers = &status.PeerBytes{Address: address}
	}
	st := set("app", status.Ready, 1, 1)
	st.Conditions = append(st.Conditions, status.Condition{Type: status.ConditionRegistryIndependent, Status: status.Unknown, Reason: status.ReasonBlobHoldersUnknown},
		status.Condition{Type: status.ConditionPodsStartWithoutRegistry, Status: status.True, Reason: status.ReasonImagesHeld})
	n.Sets = []status.Set{st}
	return v1.FromStatus(n, "boot", seq, time.Minute)
}

// holdersStore is a store past its warm-up, counting again at every question.
func holdersStore(now *time.Time) *Store {
	s := NewStore(DefaultLimits(), func() time.Time { return *now })
	s.holders.every = 0
	*now = now.Add(HoldersWarmup)
	return s
}

// Three nodes pin app: every one Ready and its pods start without the registry, yet a
// layer is held by no node and another by w1 alone. The set is not registry
// independent: the rollup, and each node's answer, name the two blobs with their image,
// size and holders, and who would fail to join, and no node is said to need the
// registry when a pod starts; once two nodes hold each blob, it is (the aggregator's
// count, before the nodes have had it).
func TestRollupCountsTheHoldersOfEveryBlob(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := holdersStore(&now)
	ingest := func(r *v1.NodeReport) {
		t.Helper()
		if ok, err := s.Ingest(r.GetNode(), r); err != nil || !ok {
			t.Fatalf("%s: %v %v", r.GetNode(), ok, err)
		}
	}
	ingest(blobsReport("w1", "10.0.0.1:7444", 1, appBlobs("0123", "")))
	ingest(blobsReport("w2", "10.0.0.2:7444", 1, appBlobs("012", "")))
	ingest(blobsReport("w3", "10.0.0.3:7444", 1, appBlobs("01", "")))

	v, _ := s.Set("app", false)
	h := v.BlobHolders
	if v.PodsStartNodes != 3 || v.RegistryDependentNodes != 0 || v.RegistryGone() || h.Status != status.False || h.Images != 1 || h.Blobs != 5 || h.ShortCount != 2 {
		t.Fatalf("view: pods start on %d nodes, %d would need the registry %+v, registry gone %v, holders %+v",
			v.PodsStartNodes, v.RegistryDependentNodes, v.RegistryDependent, v.RegistryGone(), h)
	}
	want := []status.ShortBlob{
		{Digest: blob("4"), Image: appImage, Size: 5 << 20, Pinners: 3},
		{Digest: blob("3"), Image: appImage, Size: 4 << 20, Holders: []string{"w1"}, Pinners: 3},
	}
	if !slices.EqualFunc(h.Short, want, func(a, b status.ShortBlob) bool {
		return a.Digest == b.Digest && a.Image == b.Image && a.Size == b.Size && slices.Equal(a.Holders, b.Holders) && a.Seeded == b.Seeded && a.Pinners == b.Pinners
	}) {
		t.Fatalf("short %+v; want %+v", h.Short, want)
	}
	why := h.Why()
	for _, w := range []string{
		"2 of the 5 blobs of the images are held by fewer than 2 nodes",
		blob("4") + " (5.0 MiB, of " + appImage + ") is held by no node: any node joining, or replacing one of the 3 that pin the image, would fail",
		blob("3") + " (4.0 MiB, of " + appImage + ") is held by w1 only: a node replacing w1 would fail, and any node joining once w1 is gone",
	} {
		if !strings.Contains(why, w) {
			t.Fatalf("why %q; want it to contain %q", why, w)
		}
	}
	// The metrics say the blobs apart from the nodes: every node's own pods start.
	if short, dependent := setGauge(t, s, "imagepin_aggregator_set_blobs_short", "app"), setGauge(t, s, "imagepin_aggregator_set_registry_dependent_nodes", "app"); short != 2 || dependent != 0 {
		t.Fatalf("metrics: blobs short %v, registry dependent nodes %v; want 2, 0", short, dependent)
	}
	// Each node's report gets the same count for its set back.
	answers, want2 := s.Answer("w2")
	if want2 || len(answers) != 1 || answers[0].GetSet() != "app" || answers[0].GetHolders().ToStatus().Why() != why {
		t.Fatalf("w2's answer %v (want the table: %v)", answers, want2)
	}

	// A seed's medium counts as one holder more: w3 seeded layer 4, which it holds, so
	// layer 4 has two holders; layer 3 is still w1's alone.
	ingest(blobsReport("w3", "10.0.0.3:7444", 2, appBlobs("014", "4")))
	v, _ = s.Set("app", false)
	if h := v.BlobHolders; h.Status != status.False || h.ShortCount != 1 || h.Short[0].Digest != blob("3") {
		t.Fatalf("after w3's seed: %+v", h)
	}
	// w2 fills layer 3 and 4: every blob has two holders.
	ingest(blobsReport("w2", "10.0.0.2:7444", 2, appBlobs("01234", "")))
	v, _ = s.Set("app", false)
	if h := v.BlobHolders; h.Status != status.True || h.ShortCount != 0 || h.Unknown != "" || !v.RegistryGone() {
		t.Fatalf("every blob held twice: %+v", h)
	}
	if a, _ := s.Answer("w1"); a[0].GetHolders().GetStatus() != status.True {
		t.Fatalf("w1's answer %v", a)
	}

	// w1 goes silent: a lost node holds nothing, and layers 2 and 3 are w2's alone.
	now = now.Add(4 * time.Minute)
	ingest(blobsReport("w2", "10.0.0.2:7444", 3, appBlobs("01234", "")))
	ingest(blobsReport("w3", "10.0.0.3:7444", 3, appBlobs("014", "4")))
	v, _ = s.Set("app", false)
	if h := v.BlobHolders; h.Status != status.False || h.ShortCount != 2 || h.Short[0].Digest != blob("2") || h.Short[1].Digest != blob("3") ||
		!slices.Equal(h.Short[1].Holders, []string{"w2"}) || h.Short[1].Pinners != 2 {
		t.Fatalf("w1 silent: %+v", h)
	}
}

// What a node that cannot be counted does to the answer: a node sharing nothing holds
// nothing for anyone (False); a node sharing but saying nothing of its blobs (an older
// imagepind) may hold any (Unknown, never True); and so may every node in the
// aggregator's first two heartbeats, before they reported to it.
func TestHoldersThatCannotBeCounted(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := holdersStore(&now)
	for _, r := range []*v1.NodeReport{
		blobsReport("w1", "10.0.0.1:7444", 1, appBlobs("01234", "")),
		blobsReport("w2", "", 1, appBlobs("01234", "")), // [peers] off: serves no peer
	} {
		if _, err := s.Ingest(r.GetNode(), r); err != nil {
			t.Fatal(err)
		}
	}
	if h := s.Holders([]string{appImage}); h.Status != status.False || h.ShortCount != 5 || !slices.Equal(h.Short[0].Holders, []string{"w1"}) || h.Short[0].Pinners != 2 {
		t.Fatalf("a node sharing nothing counted: %+v", h)
	}
	// An image no node that shares pins: none of its blobs can be had.
	other := "reg.example/shop/other@sha256:" + strings.Repeat("b", 64)
	if h := s.Holders([]string{other}); h.Status != status.False || h.NoHolderCount != 1 || h.NoHolder[0] != other ||
		!strings.Contains(h.Why(), "1 of the 1 images are pinned by no node that shares its blobs") {
		t.Fatalf("an image no node pins: %+v %q", h, h.Why())
	}

	old := peerReport("w3", "10.0.0.3:7444", 1, "app") // an imagepind that does not say
	if _, err := s.Ingest("w3", old); err != nil {
		t.Fatal(err)
	}
	h := s.Holders([]string{appImage, other})
	if h.Status != status.Unknown || h.ShortCount != 0 || !strings.Contains(h.Unknown, "1 nodes that share blobs do not say which they hold") ||
		!strings.Contains(h.Unknown, ": w3") || !strings.Contains(h.Unknown, "5 blobs have fewer than 2 holders known") {
		t.Fatalf("an older node may hold them: %+v", h)
	}

	fresh := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s = NewStore(DefaultLimits(), func() time.Time { return fresh })
	s.holders.every = 0
	r := blobsReport("w1", "10.0.0.1:7444", 1, appBlobs("0", ""))
	if _, err := s.Ingest("w1", r); err != nil {
		t.Fatal(err)
	}
	if h := s.Holders([]string{appImage}); h.Status != status.Unknown || !strings.Contains(h.Unknown, "the aggregator started less than 1m0s ago") {
		t.Fatalf("warming up: %+v", h)
	}
	fresh = fresh.Add(HoldersWarmup)
	if h := s.Holders([]string{appImage}); h.Status != status.False || h.ShortCount != 5 {
		t.Fatalf("warmed up: %+v", h)
	}
}

// A table is sent once: a report naming a table the aggregator lacks is taken, and its
// answer asks for the table; one carrying a table that is not its id's, or bitmaps of
// another length, is refused and changes nothing.
func TestBlobTablesAreSentOnceAndChecked(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := holdersStore(&now)
	full := blobsReport("w1", "10.0.0.1:7444", 1, appBlobs("01234", ""))
	idOnly := blobsReport("w2", "10.0.0.2:7444", 1, appBlobs("01234", ""))
	idOnly.Blobs.Table = nil
	if ok, err := s.Ingest("w2", idOnly); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if a, want := s.Answer("w2"); !want || a[0].GetHolders().GetStatus() != status.Unknown ||
		!strings.Contains(a[0].GetHolders().GetUnknown(), "waiting for this node's list of blobs") {
		t.Fatalf("a table the aggregator lacks: want %v, %v", want, a)
	}
	if _, err := s.Ingest("w1", full); err != nil {
		t.Fatal(err)
	}
	idOnly.Sequence = 2 // the same table, kept now for w1
	if _, err := s.Ingest("w2", idOnly); err != nil {
		t.Fatal(err)
	}
	if a, want := s.Answer("w2"); want || a[0].GetHolders().GetStatus() != status.True {
		t.Fatalf("the table kept for another node: want %v, %v", want, a)
	}

	lying := blobsReport("w1", "10.0.0.1:7444", 2, appBlobs("01234", ""))
	lying.Blobs.Table.Images[0].Blobs[0].Size++
	short := blobsReport("w1", "10.0.0.1:7444", 3, appBlobs("01234", ""))
	short.Blobs.Held = nil
	notDigest := blobsReport("w1", "10.0.0.1:7444", 4, appBlobs("01234", ""))
	notDigest.Blobs.Table.Images[0].Blobs[0].Digest = "sha256:nothex"
	notDigest.Blobs.TableId = v1.TableID(notDigest.Blobs.Table)
	for name, r := range map[string]*v1.NodeReport{"another table's id": lying, "a short bitmap": short, "not a digest": notDigest} {
		if _, err := s.Ingest("w1", r); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if a, _ := s.Answer("w1"); a[0].GetHolders().GetStatus() != status.True {
		t.Fatalf("a refused report changed the count: %v", a)
	}
	// Forgotten nodes let go of their table.
	now = now.Add(48 * time.Hour)
	s.Forget(time.Hour, nil)
	if len(s.tables) != 0 {
		t.Fatalf("tables kept: %d", len(s.tables))
	}
}

// setGauge is the value of the aggregator's gauge name for set, as a scrape reads it.
func setGauge(t *testing.T, s *Store, name, set string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(&collector{store: s})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "set" && l.GetValue() == set {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{set=%q}", name, set)
	return 0
}
