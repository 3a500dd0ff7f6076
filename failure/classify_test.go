package failure

import (
	"errors"
	"fmt"
	"testing"
)

func TestClassify(t *testing.T) {
	cases := map[string]Class{
		"reading manifest sha256:abc in 127.0.0.1:5000/x: manifest unknown":                                                                  Unavailable,
		"initializing source docker://q/x@sha256:1: requested access to the resource is denied":                                              Unavailable,
		"unauthorized: authentication required":                                                                                              Unavailable,
		`choosing image instance: no image found in manifest list for architecture "s390x"`:                                                  Unavailable,
		"pinging container registry 127.0.0.1:5999: Get \"http://127.0.0.1:5999/v2/\": dial tcp 127.0.0.1:5999: connect: connection refused": Transient,
		"received unexpected HTTP status: 503 Service Unavailable":                                                                           Transient,
		"writing blob: storing blob to file \"/var/tmp/x\": write /var/tmp/x: no space left on device":                                       NoSpace,
		"something nobody has seen": Transient,
		"(Mirrors also failed: [mirror.local/ocp/x@sha256:0: reading manifest sha256:0 in mirror.local/ocp/x: manifest unknown]): upstream.example.invalid/ocp/x@sha256:0: pinging container registry upstream.example.invalid: Get \"https://upstream.example.invalid/v2/\": dial tcp: lookup upstream.example.invalid: no such host": Unavailable,
		"(Mirrors also failed: [mirror.local/ocp/x@sha256:0: pinging container registry mirror.local: connection refused]): upstream.example.invalid/ocp/x@sha256:0: dial tcp: lookup upstream.example.invalid: no such host":                                                                                                          Transient,
	}
	for msg, want := range cases {
		if got := Classify(errors.New(msg)); got != want {
			t.Errorf("Classify(%q) = %v, want %v", msg, got, want)
		}
	}
	if Classify(fmt.Errorf("pull x: %w: eof", ErrRuntimeUnavailable)) != Transient {
		t.Error("runtime down must be transient")
	}
	if Classify(fmt.Errorf("pull x: %w: manifest unknown", ErrRuntimeUnavailable)) != Transient {
		t.Error("runtime down must be transient whatever its text")
	}
}
