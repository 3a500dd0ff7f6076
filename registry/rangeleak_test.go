package registry

import (
	"context"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.podman.io/image/v5/types"
)

// chunk has the shape of containers/image's private.ImageSourceChunk, which readRange
// builds by reflection.
type chunk struct{ Offset, Length uint64 }

// ignoresRange is an image source whose GetBlobAt behaves as containers/image's does
// against a registry that ignores Range (splitHTTP200ResponseToPartial): it reads through
// the blob to the offset, then hands over a stream on an unbuffered channel, or, if its
// request is cancelled first, an error on another; it ends only once one is taken.
type ignoresRange struct {
	types.ImageSource
	skip  time.Duration // how long reading up to the offset takes
	ended atomic.Int32
}

func (s *ignoresRange) GetBlobAt(ctx context.Context, _ types.BlobInfo, chunks []chunk) (chan io.ReadCloser, chan error, error) {
	streams, errs := make(chan io.ReadCloser), make(chan error)
	go func() {
		defer s.ended.Add(1)
		defer close(streams)
		defer close(errs)
		select {
		case <-time.After(s.skip):
			streams <- io.NopCloser(strings.NewReader(strings.Repeat("x", int(chunks[0].Length))))
		case <-ctx.Done():
			errs <- ctx.Err() // the body's read fails when the request is cancelled
		}
	}()
	return streams, errs, nil
}

// A Range read that times out must not leave containers/image's reader blocked forever:
// before the fix each one leaked a goroutine and its ~1 MiB read-ahead buffer.
func TestRangeReadAgainstARegistryIgnoringRangeDoesNotLeak(t *testing.T) {
	src := &ignoresRange{skip: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := readRange(ctx, src, types.BlobInfo{Size: 1 << 30}, 1<<30-4, 4); err == nil {
		t.Fatal("a read that cannot finish succeeded")
	}
	deadline := time.Now().Add(5 * time.Second)
	for src.ended.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the source's reader is still blocked after the read gave up")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A read that finishes in time still works through the same path.
	ok := &ignoresRange{skip: time.Millisecond}
	b, err := readRange(context.Background(), ok, types.BlobInfo{}, 0, 4)
	if err != nil || string(b) != "xxxx" {
		t.Fatalf("%q %v", b, err)
	}
}
