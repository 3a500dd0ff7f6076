package bytesize

import "testing"

func TestHuman(t *testing.T) {
	for b, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 5 << 30: "5.0 GiB", 3 << 50: "3.0 PiB", 2048 << 50: "2048.0 PiB"} {
		if got := Human(b); got != want {
			t.Errorf("Human(%d) = %q, want %q", b, got, want)
		}
	}
}
