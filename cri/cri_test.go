package cri

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/imagepin/imagepin/failure"
)

// The runtime's text reaches failure.Classify word for word; a runtime that does not
// answer is transient whatever it says.
func TestConvertedErrorsClassify(t *testing.T) {
	cases := map[error]failure.Class{
		status.Error(codes.NotFound, "reading manifest sha256:abc in 127.0.0.1:5000/x: manifest unknown"):             failure.Unavailable,
		status.Error(codes.Unknown, "writing blob: write /var/tmp/x: no space left on device"):                        failure.NoSpace,
		status.Error(codes.Unknown, "received unexpected HTTP status: 503 Service Unavailable"):                       failure.Transient,
		status.Error(codes.Unavailable, "connection error: desc = transport: Error while dialing: manifest unknown"):  failure.Transient,
		status.Error(codes.DeadlineExceeded, "context deadline exceeded: requested access to the resource is denied"): failure.Transient,
	}
	for in, want := range cases {
		err := convert("pull x", in)
		if got := failure.Classify(err); got != want {
			t.Errorf("Classify(convert(%v)) = %v, want %v", in, got, want)
		}
	}
	var pe *PullError
	if err := convert("pull x", status.Error(codes.NotFound, "manifest unknown")); !errors.As(err, &pe) || err.Error() != "manifest unknown" {
		t.Errorf("the runtime's text word for word: %v", err)
	}
	if !errors.Is(convert("pull x", status.Error(codes.Unavailable, "down")), ErrUnavailable) {
		t.Error("codes.Unavailable is ErrUnavailable")
	}
	if failure.Classify(fmt.Errorf("pull x: %w: eof", ErrUnavailable)) != failure.Transient {
		t.Error("runtime down must be transient")
	}
}
