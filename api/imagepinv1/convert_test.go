package imagepinv1

import (
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/imagepin/imagepin/status"
)

func TestRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 21, 10, 0, 0, 123, time.UTC)
	n := status.Node{
		Updated: at,
		Node: status.NodeInfo{Name: "w3", Architecture: "arm64", Version: "0.1.0", Runtime: status.Runtime{Name: "cri-o", Version: "1.34.0"},
			ImageFilesystem: status.ImageFilesystem{Path: "/var/lib/containers/storage", CapacityBytes: 100, FreeBytes: 40},
			Peers:           &status.PeerBytes{Address: "10.0.0.3:7444", FromRegistry: 1, FromPeers: 2, ToPeers: 3, Stored: 4}},
		Sets: []status.Set{{Name: "s", UID: "u", SpecHash: "h", File: "s.yaml", Phase: status.Failed, ImagesTotal: 3, ImagesReady: 2, BytesTotal: 30, BytesReady: 20, BytesFromRegistry: 12,
			Conditions:   []status.Condition{{Type: "Ready", Status: "False", Reason: "ImageUnavailable", Message: "m", LastTransitionTime: at}},
			FailedImages: []status.FailedImage{{Image: "i", Reason: "ImageUnavailable", Error: "manifest unknown"}},
			Release:      &status.Release{Image: "r@sha256:1", Version: "4.18.3", Images: 180}}},
		FileErrors: []status.FileError{{File: "x.yaml", Error: "bad"}},
		Faults:     []string{"sets directory is missing"},
	}
	r := FromStatus(n, "boot", 7, 30*time.Second)
	b, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back NodeReport
	if err := proto.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.GetBootId() != "boot" || back.GetSequence() != 7 || back.GetHeartbeatMillis() != 30000 {
		t.Fatalf("%+v", &back)
	}
	if got := back.ToStatus(); !reflect.DeepEqual(got, n) {
		t.Fatalf("round trip:\n%+v\n%+v", got, n)
	}
}
