package env

import (
	"net"
	"strconv"
	"testing"
)

// FreePort picks ports below the kernel's ephemeral range, which outgoing connections
// take from, and each one it returns can be listened on.
func TestFreePortIsBelowTheEphemeralRange(t *testing.T) {
	lo := ephemeralLow()
	for range 50 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if p < minPort || p >= lo {
			t.Fatalf("port %d outside [%d, %d)", p, minPort, lo)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d: %v", p, err)
		}
		l.Close()
	}
}
