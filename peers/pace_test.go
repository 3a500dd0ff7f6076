package peers

import "testing"

// A paced answer moves a twentieth of a second's worth at a time, from 4 KiB to 256 KiB:
// at the rates serve_mib_per_second allows, more than a write of the mirror carries.
func TestPaceChunk(t *testing.T) {
	for _, c := range []struct {
		bps  int64
		want int
	}{{0, 4 << 10}, {40 << 10, 4 << 10}, {250_000, 12_500}, {1 << 20, 52_428}, {50 << 20, 256 << 10}} {
		if got := PaceChunk(c.bps); got != c.want {
			t.Errorf("PaceChunk(%d) = %d, want %d", c.bps, got, c.want)
		}
	}
	if PaceChunk(1<<20) <= 32<<10 {
		t.Errorf("at 1 MiB/s a piece is %d bytes, within a write of 32 KiB", PaceChunk(1<<20))
	}
}
