package status

import (
	"fmt"
	"strings"
	"testing"
)

// The words of a count: each blob held by too few nodes with its image, size and
// holders and who would fail to join, the rest counted; images no sharing node pins;
// why it cannot be told.
func TestBlobHoldersWhy(t *testing.T) {
	d := func(c string) string { return "sha256:" + strings.Repeat(c, 64) }
	var short []ShortBlob
	for i := range MaxShortNamed {
		short = append(short, ShortBlob{Digest: d(fmt.Sprint(i)), Image: "reg.example/a@" + d("a"), Size: 2048, Pinners: 4})
	}
	short[1] = ShortBlob{Digest: d("1"), Image: "reg.example/a@" + d("a"), Size: 5 << 20, Seeded: true, Pinners: 1}
	h := BlobHolders{Status: False, Images: 3, Blobs: 40, Short: short, ShortCount: 7, NoHolder: []string{"reg.example/o@" + d("b")}, NoHolderCount: 1,
		Unknown: "1 nodes that share blobs do not say which they hold"}
	why := h.Why()
	for _, want := range []string{
		"1 of the 3 images are pinned by no node that shares its blobs ([peers] on), so a node joining or replacing one would find none of their blobs: reg.example/o@" + d("b"),
		"7 of the 40 blobs of the images are held by fewer than 2 nodes",
		d("0") + " (2.0 KiB, of reg.example/a@" + d("a") + ") is held by no node: any node joining, or replacing one of the 4 that pin the image, would fail",
		d("1") + " (5.0 MiB, of reg.example/a@" + d("a") + ") is held by a seed's medium only: a node joining would fail unless the medium is seeded on it",
		"; and 2 more",
		"; whether every blob of the images is held by 2 nodes cannot be told: 1 nodes that share blobs do not say which they hold",
	} {
		if !strings.Contains(why, want) {
			t.Fatalf("%q lacks %q", why, want)
		}
	}
	if got := (BlobHolders{Status: True, Blobs: 3}).Why(); got != "" {
		t.Fatalf("True: %q", got)
	}
}
