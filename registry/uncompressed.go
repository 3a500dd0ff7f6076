package registry

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"time"

	"go.podman.io/image/v5/types"
)

// What a layer takes once stored: CRI-O (containers/storage) keeps layers uncompressed,
// and a pull holds the compressed blob while it applies it. The compressed size says
// nothing of how well a layer compresses, so the check asks the blob itself, cheaply:
//
//   - gzip: the trailer's ISIZE, the last 4 bytes (RFC 1952: the uncompressed size modulo
//     2^32, of the last member only);
//   - zstd: the first frame header's content size, when the frame records it (RFC 8878);
//   - an uncompressed tar: its own size.
//
// Each is one small HTTP Range request through the same containers/image source that
// served the manifest (its mirror, certificates and credentials). Anything that cannot
// be read or does not look right is "unknown", and the multiplier alone decides.

// Sources of a layer's uncompressed size.
const (
	FromGzipTrailer = "gzip trailer"
	FromZstdHeader  = "zstd frame header"
	FromTar         = "uncompressed tar"
)

// rangeTimeout bounds one Range request. A registry that ignores Range answers with the
// whole blob, which containers/image would read up to the offset: the deadline stops
// that from costing more than a few seconds of transfer.
const rangeTimeout = 5 * time.Second

// plausible is the least uncompressed ÷ compressed ratio taken as real. Below it, the
// trailer belongs to the last of several gzip members (a multi-member stream), or a
// zstd frame is only the first of several: unknown.
const plausible = 0.5

// rangeOf reads n bytes of a blob at off: a Range request to a registry (readRange), or
// a read of the node's store.
type rangeOf func(ctx context.Context, l types.BlobInfo, off, n uint64) ([]byte, error)

// The most a layer can decompress to, as a ratio of its compressed size: deflate's
// longest match (258 bytes) costs at least 2 bits, 1032:1; a zstd block regenerates at
// most 128 KiB and costs at least 4 bytes (an RLE block: its 3-byte header and the
// byte), 32768:1. A trailer or header claiming more is not believed (unknown), so
// maxUncompressed bounds what uncompressedSize can report whatever the blob says.
const (
	gzipMaxRatio = 1032
	zstdMaxRatio = 32768
)

// maxUncompressed is the most uncompressedSize can report for l; 0 when it reports
// nothing (no Range request is made for it and the multiplier decides).
func maxUncompressed(l types.BlobInfo) int64 {
	mt := strings.ToLower(l.MediaType)
	switch {
	case l.Size <= 0 || l.Size > MaxLayerSize:
		return 0
	case strings.Contains(mt, "gzip"):
		if l.Size < 18 || l.Size >= 1<<32 {
			return 0
		}
		return min(gzipMaxRatio*l.Size, 1<<32-1) // ISIZE is 32 bits
	case strings.Contains(mt, "zstd"):
		return min(zstdMaxRatio*l.Size, MaxLayerSize)
	case isTar(l):
		return l.Size
	}
	return 0
}

// isTar: an uncompressed layer, its own size.
func isTar(l types.BlobInfo) bool {
	return strings.HasSuffix(strings.ToLower(l.MediaType), ".tar")
}

// uncompressedSize returns a layer's uncompressed size and how it was learned; 0 when
// unknown. requests counts the reads of read made. It never reports more than
// maxUncompressed(l).
func uncompressedSize(ctx context.Context, read rangeOf, l types.BlobInfo) (size int64, from string, requests int) {
	mt := strings.ToLower(l.MediaType)
	switch {
	case l.Size <= 0:
		return 0, "", 0
	case strings.Contains(mt, "gzip"):
		if l.Size < 18 || l.Size >= 1<<32 {
			// A gzip header and trailer at least; ISIZE is the size modulo 2^32, which
			// says nothing once the compressed blob alone is 4 GiB.
			return 0, "", 0
		}
		b, err := read(ctx, l, uint64(l.Size-4), 4)
		if err != nil {
			return 0, "", 1
		}
		isize := int64(binary.LittleEndian.Uint32(b))
		if float64(isize) < plausible*float64(l.Size) || isize > maxUncompressed(l) {
			return 0, "", 1
		}
		return isize, FromGzipTrailer, 1
	case strings.Contains(mt, "zstd"):
		n := min(l.Size, 18) // magic 4, descriptor 1, window 1, dictionary ID ≤ 4, content size ≤ 8
		b, err := read(ctx, l, 0, uint64(n))
		if err != nil {
			return 0, "", 1
		}
		fcs, ok := zstdContentSize(b)
		if !ok || float64(fcs) < plausible*float64(l.Size) || fcs > maxUncompressed(l) {
			return 0, "", 1
		}
		return fcs, FromZstdHeader, 1
	case isTar(l): // application/vnd.oci.image.layer.v1.tar, …rootfs.diff.tar
		return l.Size, FromTar, 0
	}
	return 0, "", 0
}

// zstdContentSize parses a zstd frame header (RFC 8878 3.1.1.1): the frame content size
// when the frame records it.
func zstdContentSize(b []byte) (int64, bool) {
	if len(b) < 5 || binary.LittleEndian.Uint32(b) != 0xFD2FB528 {
		return 0, false
	}
	fhd := b[4]
	fcsFlag, single, dictFlag := fhd>>6, fhd>>5&1, fhd&3
	pos := 5
	if single == 0 {
		pos++ // window descriptor
	}
	pos += []int{0, 1, 2, 4}[dictFlag]
	size := []int{0, 2, 4, 8}[fcsFlag]
	if fcsFlag == 0 && single == 1 {
		size = 1
	}
	if size == 0 || len(b) < pos+size {
		return 0, false
	}
	f := b[pos : pos+size]
	switch size {
	case 1:
		return int64(f[0]), true
	case 2:
		return int64(binary.LittleEndian.Uint16(f)) + 256, true
	case 4:
		return int64(binary.LittleEndian.Uint32(f)), true
	}
	v := binary.LittleEndian.Uint64(f)
	if v > 1<<62 {
		return 0, false
	}
	return int64(v), true
}

// drainRange closes every stream and drops every error a GetBlobAt still sends, until it
// closes its channels (nil channels are done).
func drainRange(streams chan io.ReadCloser, errs chan error) {
	for streams != nil || errs != nil {
		select {
		case rc, ok := <-streams:
			if !ok {
				streams = nil
				continue
			}
			rc.Close()
		case _, ok := <-errs:
			if !ok {
				errs = nil
			}
		}
	}
}

var errNoRanges = errors.New("the image source cannot read part of a blob")

// readRange reads n bytes at off of a blob through src's GetBlobAt: an HTTP Range request
// to the endpoint that served the manifest. containers/image exposes GetBlobAt only with
// a chunk type of an internal package (private.ImageSourceChunk{Offset, Length}), so the
// call goes through reflection; if the method or the type changes shape, this fails
// cleanly (errNoRanges) and the size stays unknown. TestUncompressedSizesByRange holds it
// to the containers/image version in go.mod.
func readRange(ctx context.Context, src types.ImageSource, info types.BlobInfo, off, n uint64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, rangeTimeout)
	defer cancel()
	m := reflect.ValueOf(src).MethodByName("GetBlobAt")
	if !m.IsValid() {
		return nil, errNoRanges
	}
	t := m.Type()
	if t.NumIn() != 3 || t.NumOut() != 3 || t.In(2).Kind() != reflect.Slice || t.In(2).Elem().Kind() != reflect.Struct ||
		t.Out(0) != reflect.TypeFor[chan io.ReadCloser]() || t.Out(1) != reflect.TypeFor[chan error]() {
		return nil, errNoRanges
	}
	chunk := reflect.New(t.In(2).Elem()).Elem()
	offset, length := chunk.FieldByName("Offset"), chunk.FieldByName("Length")
	if !offset.IsValid() || !length.IsValid() || offset.Kind() != reflect.Uint64 || length.Kind() != reflect.Uint64 || chunk.NumField() != 2 {
		return nil, errNoRanges
	}
	offset.SetUint(off)
	length.SetUint(n)
	chunks := reflect.MakeSlice(t.In(2), 1, 1)
	chunks.Index(0).Set(chunk)
	out := m.Call([]reflect.Value{reflect.ValueOf(ctx), reflect.ValueOf(info), chunks})
	if err, _ := out[2].Interface().(error); err != nil {
		return nil, err
	}
	streams, errs := out[0].Interface().(chan io.ReadCloser), out[1].Interface().(chan error)
	var data []byte
	var firstErr error
	for streams != nil || errs != nil {
		select {
		case rc, ok := <-streams:
			if !ok {
				streams = nil
				continue
			}
			if data == nil && firstErr == nil {
				data, firstErr = io.ReadAll(io.LimitReader(rc, int64(n)))
			}
			rc.Close()
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			if firstErr == nil {
				firstErr = err
			}
		case <-ctx.Done():
			// containers/image's reader goes on until it can hand over what it has: a
			// registry that ignores Range leaves it skipping through the blob, then
			// blocked on an unbuffered send with a 1 MiB read-ahead buffer
			// (splitHTTP200ResponseToPartial). Take what it sends until it closes both.
			go drainRange(streams, errs)
			return nil, ctx.Err()
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	if uint64(len(data)) != n {
		return nil, fmt.Errorf("range of %s: %d bytes, want %d", info.Digest, len(data), n)
	}
	return data, nil
}
