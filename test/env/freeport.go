package env

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
)

// FreePort returns a TCP port free on 127.0.0.1 now, for a process started later to
// listen on. It is chosen below the kernel's ephemeral range: a port the kernel hands
// out (":0") may be handed out again, to an outgoing connection, before that process
// binds it ("address already in use", seen in CI). Below the range, only another
// FreePort could take it in between.
func FreePort() (int, error) {
	lo := ephemeralLow()
	for range 100 {
		p := minPort + rand.IntN(lo-minPort)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		l.Close()
		return p, nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// minPort is the lowest port FreePort picks: above the well-known and most registered
// services' ports.
const minPort = 20000

// ephemeralLow is the first port of the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), 32768 when it cannot be read.
func ephemeralLow() int {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var hi int
		if n, _ := fmt.Sscan(string(b), &lo, &hi); n != 2 || lo <= minPort+100 {
			lo = 32768
		}
	}
	return lo
}
