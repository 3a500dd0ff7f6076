package main

import (
	"strings"
	"testing"
)

// The read side is never open to anyone: without --cluster it defaults to loopback and
// refuses another address unless client certificates are required.
func TestReadAddress(t *testing.T) {
	for _, c := range []struct {
		o       options
		want    string
		refused bool
	}{
		{o: options{}, want: "127.0.0.1:9444"},
		{o: options{cluster: true}, want: ":9444"},
		{o: options{httpAddress: "[::1]:9000"}, want: "[::1]:9000"},
		{o: options{httpAddress: "localhost:9000"}, want: "localhost:9000"},
		{o: options{httpAddress: ":9444"}, refused: true},
		{o: options{httpAddress: "10.0.0.5:9444"}, refused: true},
		{o: options{httpAddress: ":9444", readClientCA: "/ca.crt"}, want: ":9444"},
		{o: options{httpAddress: "0.0.0.0:9444", cluster: true}, want: "0.0.0.0:9444"},
	} {
		o := c.o
		err := resolveReadAddress(&o)
		if c.refused {
			if err == nil || !strings.Contains(err.Error(), "--read-client-ca") {
				t.Errorf("%+v: %v, want a refusal that says how to fix it", c.o, err)
			}
			continue
		}
		if err != nil || o.httpAddress != c.want {
			t.Errorf("%+v: %q %v, want %q", c.o, o.httpAddress, err, c.want)
		}
	}
}
