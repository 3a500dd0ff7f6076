package main

import (
	"errors"
	"testing"

	"github.com/sirupsen/logrus"
)

// A peer set aside is counted by what was asked and why, without the URL or the
// connection's addresses: each would be a row of its own. A request that failed before
// its answer (its error names the URL as Go's client does) is told from one whose
// answer's body failed.
func TestAsideKindDropsURLsAndAddresses(t *testing.T) {
	for why, want := range map[string]string{
		`Get "https://127.10.0.170:37279/v2/r/manifests/sha256:f4": unexpected EOF`:                                             "manifest (request): unexpected EOF",
		`Get "https://127.10.0.7:37279/v2/r/blobs/sha256:aa": write tcp 127.0.0.1:32830->127.10.0.64:37279: write: broken pipe`: "blob (request): write: broken pipe",
		`https://127.10.0.76:37279/v2/r/manifests/sha256:cc: nothing for 15s: the peer took the request and sends nothing`:      "manifest (body): took the request, sent nothing (15 s)",
	} {
		e := &logrus.Entry{Data: logrus.Fields{logrus.ErrorKey: errors.New(why)}}
		if got := asideKind(e); got != want {
			t.Errorf("%s: %q, want %q", why, got, want)
		}
	}
}
