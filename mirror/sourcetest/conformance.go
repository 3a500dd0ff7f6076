// Package sourcetest is the conformance suite of the mirror's blob source port
// (mirror.Source): the contract every source the mirror fills from keeps, checked on
// each of them: the registry (mirror.FromRegistry over an in-process registry, in
// package mirror's tests), the peers (peers.Source over in-process HTTPS nodes with
// that registry behind them, in package peers' tests) and Fake, an in-memory source for
// tests. Each subtest stands a fresh source on an Origin: a registry that sends
// honestly, or lies about sizes, stalls or hangs.
//
// For tests only (hack/verify-imports.sh): no command links it.
package sourcetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/mirror"
)

// Subject is one kind of source to check.
type Subject struct {
	// New is a fresh source standing on o: with a registry behind it, o's registry
	// (Host, CA, CertsDir), pinning what o.Pinned says; in memory, o's Manifest and
	// Send (FakeOf).
	New func(t *testing.T, o *Origin) mirror.Source
}

var (
	// promptly bounds how long a call may go on once its context is cancelled, and how
	// long an unknown digest takes to be an error.
	promptly = 5 * time.Second
	// transferring bounds a transfer of a few hundred KiB in process (generous: the
	// race detector, a loaded machine).
	transferring = 30 * time.Second
)

// layerSize is about each layer's size: half of one is more than a peer holds back of
// what it streams (64 KiB, sent once the blob is checked), so a stalled blob still
// streams its first bytes.
const layerSize = 512 << 10

// Run runs the suite against s.
func Run(t *testing.T, s Subject) {
	stand := func(t *testing.T, how Sending) (*Origin, mirror.Source) {
		t.Helper()
		o := newOrigin(t, how, layerSize)
		return o, s.New(t, o)
	}

	// A manifest asked for by digest comes back byte for byte, with the media type the
	// registry serves it with (the index with no chain: it is pinned; the image
	// manifest with the index above it).
	t.Run("ManifestByDigest", func(t *testing.T) {
		o, src := stand(t, Honest)
		for _, c := range []struct {
			d     digest.Digest
			chain []digest.Digest
			size  int64
		}{{o.Index, nil, -1}, {o.Image, []digest.Digest{o.Index}, int64(len(o.manifests[o.Image].Data))}} {
			m, err := within(t, "Manifest", transferring, func() (Manifest, error) {
				data, mt, err := src.Manifest(t.Context(), o.Repo, c.chain, c.d, c.size)
				return Manifest{data, mt}, err
			})
			want := o.manifests[c.d]
			if err != nil {
				t.Fatalf("manifest %s: %v", c.d, err)
			}
			if !bytes.Equal(m.Data, want.Data) {
				t.Errorf("manifest %s: %d bytes (digest %s), want the %d bytes pushed", c.d, len(m.Data), digest.FromBytes(m.Data), len(want.Data))
			}
			if m.MediaType != want.MediaType {
				t.Errorf("manifest %s: media type %q, want %q", c.d, m.MediaType, want.MediaType)
			}
		}
	})

	// A pinned manifest the origin does not hold is an error, soon (the mirror answers
	// 404: the runtime goes on to its next endpoint), not a hang or a panic.
	t.Run("UnknownManifestIsAnError", func(t *testing.T) {
		o, src := stand(t, Honest)
		m, err := within(t, "Manifest of a digest the origin lacks", promptly+transferring, func() (Manifest, error) {
			data, mt, err := src.Manifest(t.Context(), o.Repo, nil, o.Missing, -1)
			return Manifest{data, mt}, err
		})
		if err == nil {
			t.Fatalf("a manifest the origin does not hold: %d bytes (%q), no error", len(m.Data), m.MediaType)
		}
		t.Logf("as expected: %v", err)
	})

	// The size an index gives its child manifest binds as a blob's does: asked for with
	// one byte less or one more than the manifest has, a source refuses it with
	// mirror.ErrSize (a peer reads no sender past the size).
	t.Run("TheIndexsSizeBindsAManifest", func(t *testing.T) {
		o, src := stand(t, Honest)
		n := int64(len(o.manifests[o.Image].Data))
		for _, size := range []int64{n - 1, n + 1} {
			data, err := within(t, "Manifest of another size", transferring, func() ([]byte, error) {
				data, _, err := src.Manifest(t.Context(), o.Repo, []digest.Digest{o.Index}, o.Image, size)
				return data, err
			})
			if !errors.Is(err, mirror.ErrSize) {
				t.Errorf("a manifest of %d bytes asked for as %d: %d bytes, %v; want mirror.ErrSize", n, size, len(data), err)
			}
		}
	})

	// Every blob comes back byte for byte, streamed, and the size said is the
	// descriptor's, or none (-1).
	t.Run("BlobsByteExact", func(t *testing.T) {
		o, src := stand(t, Honest)
		for _, b := range o.Blobs {
			got, err := fetch(t, src, o, b.Digest, b.Size)
			if err != nil {
				t.Fatalf("blob %s: %v", b.Digest, err)
			}
			if !bytes.Equal(got, o.blobs[b.Digest]) {
				t.Fatalf("blob %s: %d bytes (digest %s), want its %d", b.Digest, len(got), digest.FromBytes(got), b.Size)
			}
		}
	})

	// A blob the origin does not hold is an error: from Blob, or a stream ending in one
	// without a byte (never io.EOF).
	t.Run("UnknownBlobIsAnError", func(t *testing.T) {
		o, src := stand(t, Honest)
		d := digest.FromString("a blob the origin does not hold")
		got, err := fetch(t, src, o, d, 100)
		if err == nil || len(got) > 0 {
			t.Fatalf("a blob the origin does not hold: %d bytes, error %v", len(got), err)
		}
	})

	// The size asked for is the descriptor's and binds: an origin announcing its own,
	// other size (one byte less, one byte more than asked) is refused by Blob with
	// mirror.ErrSize before a byte is read.
	t.Run("TheDescriptorsSizeBinds", func(t *testing.T) {
		o, src := stand(t, Honest)
		b := o.Blobs[len(o.Blobs)-1]
		for _, size := range []int64{b.Size - 1, b.Size + 1} {
			refused(t, src, o, b.Digest, size)
		}
	})

	// An origin sending another size than the descriptor's is refused or cut, with
	// mirror.ErrSize, and no byte past the size is ever delivered: announcing more or
	// less is refused by Blob; streaming on without announcing is cut at the size.
	for _, c := range []struct {
		name string
		how  Sending
	}{{"OriginThatAnnouncesMore", AnnouncesMore}, {"OriginThatAnnouncesLess", AnnouncesLess}} {
		t.Run(c.name, func(t *testing.T) {
			o, src := stand(t, c.how)
			b := o.Blobs[len(o.Blobs)-1]
			refused(t, src, o, b.Digest, b.Size)
		})
	}
	t.Run("OriginThatStreamsOn", func(t *testing.T) {
		o, src := stand(t, StreamsOn)
		b := o.Blobs[len(o.Blobs)-1]
		got, err := fetch(t, src, o, b.Digest, b.Size)
		switch {
		case errors.Is(err, errPastSize):
			t.Fatalf("%d bytes delivered for a blob of %d", len(got), b.Size)
		case err == nil:
			t.Fatalf("a stream going on past the size ended as a whole blob (%d bytes)", len(got))
		case !errors.Is(err, mirror.ErrSize):
			t.Errorf("cut after %d bytes with %v; want mirror.ErrSize", len(got), err)
		}
	})

	// The node-local mirror filling from the source answers every Range form with
	// exactly the bytes asked (206; several ranges in ascending order, one
	// multipart/byteranges answer), and a range the blob cannot meet with 416 and
	// "bytes */size": while the blob is filled (each range the first request for it, in
	// a mirror of its own), and from its store once filled.
	t.Run("TheMirrorServesRanges", func(t *testing.T) {
		o, src := stand(t, Honest)
		b := o.Blobs[len(o.Blobs)-1]
		whole := o.blobs[b.Digest]
		for i, c := range byteRanges(b.Size) {
			url := mirrorOver(t, o, src, fmt.Sprintf("filled-%d", i)) + b.Digest.String()
			if _, err := within(t, "a range while filled", transferring, func() (struct{}, error) {
				return struct{}{}, rangeAnswer(url, c, whole)
			}); err != nil {
				t.Errorf("%q while the blob is filled: %v", c.header, err)
			}
		}
		url := mirrorOver(t, o, src, "stored") + b.Digest.String()
		if _, err := fetchURL(url); err != nil {
			t.Fatalf("the blob through the mirror: %v", err)
		}
		for _, c := range byteRanges(b.Size) {
			if _, err := within(t, "a range from the store", transferring, func() (struct{}, error) {
				return struct{}{}, rangeAnswer(url, c, whole)
			}); err != nil {
				t.Errorf("%q from the store: %v", c.header, err)
			}
		}
	})

	// A blob with no known size (size < 0: its manifest gives none) is never asked for
	// by the mirror (nothing would bound the fill); a source asked anyway delivers no
	// byte and ends with an error.
	t.Run("NoSizeNoBytes", func(t *testing.T) {
		o, src := stand(t, Honest)
		b := o.Blobs[len(o.Blobs)-1]
		got, err := fetch(t, src, o, b.Digest, -1)
		if err == nil || len(got) > 0 {
			t.Fatalf("size -1: %d bytes, error %v; want no byte and an error", len(got), err)
		}
	})

	// Callers asking for the same blob at once (the mirror's fills, peers, hops) all
	// get every byte right.
	t.Run("ConcurrentBlobs", func(t *testing.T) {
		o, src := stand(t, Honest)
		b := o.Blobs[len(o.Blobs)-1]
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := read(t.Context(), src, o, b.Digest, b.Size)
				if err == nil && !bytes.Equal(got, o.blobs[b.Digest]) {
					err = errors.New("wrong bytes")
				}
				errs <- err
			}()
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(transferring):
			t.Fatalf("16 concurrent reads of a blob not done within %s", transferring)
		}
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
	})

	// A blob streams: with the origin stalled after half of it, Blob answers and the
	// first bytes arrive; cancelling the context then ends the read under way promptly,
	// with an error.
	t.Run("StreamsAndCancelEndsARead", func(t *testing.T) {
		o, src := stand(t, Stalls)
		b := o.Blobs[len(o.Blobs)-1]
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		rc, err := within(t, "Blob of a stalled origin", transferring, func() (io.ReadCloser, error) {
			rc, _, err := src.Blob(ctx, o.Repo, o.Chain(), b.Digest, b.Size)
			return rc, err
		})
		if err != nil {
			t.Fatalf("Blob of an origin that stalls half-way: %v", err)
		}
		defer rc.Close()
		var one [1]byte
		if _, err := within(t, "the first byte of a stalled blob", transferring, func() (int, error) { return io.ReadFull(rc, one[:]) }); err != nil {
			t.Fatalf("the first byte: %v", err)
		}
		type result struct {
			n   int
			err error
		}
		rest := make(chan result, 1)
		go func() {
			got, err := drain(rc, b.Size)
			rest <- result{len(got), err}
		}()
		time.Sleep(100 * time.Millisecond) // the read is under way, waiting on the origin
		cancel()
		select {
		case r := <-rest:
			if r.err == nil {
				t.Fatalf("the read ended with io.EOF after %d bytes of a blob of %d", r.n+1, b.Size)
			}
			t.Logf("%d bytes, then: %v", r.n+1, r.err)
		case <-time.After(promptly):
			t.Fatalf("a read still under way %s after its context was cancelled", promptly)
		}
	})

	// A cancelled context ends a Manifest or Blob call promptly, with an error, however
	// long the origin takes to answer.
	t.Run("CancelEndsACall", func(t *testing.T) {
		o, src := stand(t, Hangs)
		b := o.Blobs[len(o.Blobs)-1]
		calls := map[string]func(ctx context.Context) error{
			"Manifest": func(ctx context.Context) error {
				_, _, err := src.Manifest(ctx, o.Repo, nil, o.Index, -1)
				return err
			},
			"Blob": func(ctx context.Context) error {
				rc, _, err := src.Blob(ctx, o.Repo, o.Chain(), b.Digest, b.Size)
				if err == nil {
					// Answered before the origin did: the read must end then.
					_, err = drain(rc, b.Size)
					rc.Close()
				}
				return err
			},
		}
		for name, call := range calls {
			ctx, cancel := context.WithCancel(t.Context())
			ended := make(chan error, 1)
			go func() { ended <- call(ctx) }()
			time.Sleep(100 * time.Millisecond)
			cancel()
			select {
			case err := <-ended:
				if err == nil {
					t.Errorf("%s: no error from an origin that never answered", name)
				}
			case <-time.After(promptly):
				t.Errorf("%s still under way %s after its context was cancelled", name, promptly)
			}
		}
	})

	// A call made with a context already cancelled ends at once.
	t.Run("CancelledBeforeTheCall", func(t *testing.T) {
		o, src := stand(t, Honest)
		b := o.Blobs[len(o.Blobs)-1]
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		within(t, "Manifest with a cancelled context", promptly, func() ([]byte, error) {
			data, _, err := src.Manifest(ctx, o.Repo, nil, o.Index, -1)
			return data, err
		})
		within(t, "Blob with a cancelled context", promptly, func() ([]byte, error) {
			rc, _, err := src.Blob(ctx, o.Repo, o.Chain(), b.Digest, b.Size)
			if err != nil {
				return nil, err
			}
			defer rc.Close()
			return drain(rc, b.Size)
		})
	})
}

// errPastSize is a stream going on past the size asked for.
var errPastSize = errors.New("more bytes than the size asked for")

// fetch is blob d of size bytes from src, within transferring, checking what Blob
// says of its size.
func fetch(t *testing.T, src mirror.Source, o *Origin, d digest.Digest, size int64) ([]byte, error) {
	t.Helper()
	return within(t, "Blob and its read", transferring, func() ([]byte, error) {
		return read(t.Context(), src, o, d, size)
	})
}

// read is blob d of size bytes from src, read to its end (nil: io.EOF) or its error,
// or errPastSize once more than size bytes came.
func read(ctx context.Context, src mirror.Source, o *Origin, d digest.Digest, size int64) ([]byte, error) {
	rc, announced, err := src.Blob(ctx, o.Repo, o.Chain(), d, size)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	got, err := drain(rc, max(size, 0))
	if err == nil && announced >= 0 && announced != size {
		err = errors.New("the source said another size than the descriptor's, and its stream ended as a whole blob")
	}
	return got, err
}

// drain reads r to its end (nil: io.EOF) or its error, or errPastSize once more than
// limit bytes came.
func drain(r io.Reader, limit int64) ([]byte, error) {
	var buf bytes.Buffer
	p := make([]byte, 32<<10)
	for {
		n, err := r.Read(p)
		buf.Write(p[:n])
		switch {
		case int64(buf.Len()) > limit:
			return buf.Bytes(), errPastSize
		case err == io.EOF:
			return buf.Bytes(), nil
		case err != nil:
			return buf.Bytes(), err
		}
	}
}

// refused checks that Blob refuses d asked for with size, which the origin's sender
// does not send, with mirror.ErrSize, promptly.
func refused(t *testing.T, src mirror.Source, o *Origin, d digest.Digest, size int64) {
	t.Helper()
	rc, err := within(t, "Blob of another size", transferring, func() (io.ReadCloser, error) {
		rc, _, err := src.Blob(t.Context(), o.Repo, o.Chain(), d, size)
		return rc, err
	})
	if err == nil {
		got, rerr := drain(rc, size)
		rc.Close()
		t.Fatalf("asked for %d bytes of a blob its origin sends otherwise (%s): not refused; read %d bytes, then %v", size, o.Sends(), len(got), rerr)
	}
	if !errors.Is(err, mirror.ErrSize) {
		t.Errorf("asked for %d bytes of a blob its origin sends otherwise (%s): refused with %v; want mirror.ErrSize", size, o.Sends(), err)
	}
}

// within runs fn, failing the test when it has not returned after limit.
func within[T any](t *testing.T, what string, limit time.Duration, fn func() (T, error)) (T, error) {
	t.Helper()
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := fn()
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-time.After(limit):
		t.Fatalf("%s: no answer within %s", what, limit)
	}
	var zero T
	return zero, nil
}
