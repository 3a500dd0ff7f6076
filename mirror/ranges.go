package mirror

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opencontainers/go-digest"
)

// serveBlob answers r with blob d of size bytes read from body (a fill, a stream or a
// stored blob, from its first byte), through http.ServeContent: the whole blob (200),
// or the range asked (206, Content-Range), or 416 with "bytes */size" for a range the
// blob cannot meet; Accept-Ranges on every answer. Several ranges in one request are
// answered as one multipart/byteranges 206 when they come in ascending order without
// overlap (as containers/image's partial pulls ask), else with the whole blob.
//
// What is served is checked against d whatever the range: the bytes before it are
// read and checked (a fill's were checked by the fill), and after it the rest of the
// blob, to its end; the last holdBack bytes of the answer are sent only once the whole
// blob matched, so a client never receives a complete answer made of wrong bytes (a
// fill under way is waited for). An error means the answer was not completed: the
// caller cuts the client's copy. counter counts the blob's bytes sent.
func serveBlob(w http.ResponseWriter, r *http.Request, d digest.Digest, body *blobReader, size int64, counter *atomic.Int64) error {
	h := w.Header()
	h.Set("Docker-Content-Digest", d.String())
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Etag", `"`+d.String()+`"`)
	h.Set("Accept-Ranges", "bytes")
	if !inOrder(r.Header.Get("Range"), size) {
		r.Header.Del("Range")
	}
	held := &holdback{ResponseWriter: w, keep: holdBack}
	s := &seeker{r: body, size: size}
	http.ServeContent(held, r, "", time.Time{}, s)
	counter.Add(s.sentBytes())
	if r.Method == http.MethodHead || (held.status != http.StatusOK && held.status != http.StatusPartialContent) {
		// Nothing of the blob was sent (a HEAD, a 416, a 304).
		return nil
	}
	if err := r.Context().Err(); err != nil {
		return err
	}
	if err := s.finish(); err != nil {
		return err
	}
	return held.flush()
}

// holdBack is how many of an answer's last bytes wait for the blob to match its digest.
const holdBack = HoldBack

// HoldBack is how many of a blob's last bytes the mirror sends only once the blob
// matches its digest: an answer stopping within them was found wrong by its sender.
const HoldBack = 64 << 10

// seeker is a blob's reader as http.ServeContent reads it: its size known at once, a
// seek only noted, and the first read after it moving the reader forward to there
// (blobReader.skip). A seek back before what was read is refused: ServeContent is
// given ranges in ascending order only (inOrder). Its methods hold mu: ServeContent
// reads several ranges from a goroutine of its own, which may still be reading when
// ServeContent returns early (the client gone).
type seeker struct {
	mu   sync.Mutex
	r    *blobReader
	size int64
	pos  int64 // where the next read reads
	at   int64 // where r is
	sent int64 // the bytes read out
	err  error // the first error reading r
}

// errBackwards is a read before what was read already.
var errBackwards = errors.New("a range before one served already")

func (s *seeker) Seek(offset int64, whence int) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += s.pos
	case io.SeekEnd:
		offset += s.size
	default:
		return 0, fmt.Errorf("seek whence %d", whence)
	}
	if offset < 0 {
		return 0, fmt.Errorf("seek to %d", offset)
	}
	s.pos = offset
	return offset, nil
}

func (s *seeker) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return 0, s.err
	}
	if err := s.to(s.pos); err != nil {
		return 0, err
	}
	if s.pos >= s.size {
		return 0, io.EOF
	}
	n, err := s.r.Read(p[:min(int64(len(p)), s.size-s.pos)])
	s.pos += int64(n)
	s.at = s.pos
	s.sent += int64(n)
	if err == io.EOF && s.pos < s.size {
		err = io.ErrUnexpectedEOF
	}
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}

func (s *seeker) sentBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent
}

// to moves the reader forward to off.
func (s *seeker) to(off int64) error {
	switch {
	case off < s.at:
		s.err = errBackwards
	case off > s.at:
		if err := s.r.skip(off - s.at); err != nil {
			s.err = err
		} else {
			s.at = off
		}
	}
	return s.err
}

// finish reads the blob to its end, checking it: nil only when the whole blob
// matches its digest (a fill under way is waited for).
func (s *seeker) finish() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.to(s.size); err != nil {
		return err
	}
	var one [1]byte
	n, err := s.r.Read(one[:])
	switch {
	case n > 0:
		return fmt.Errorf("more bytes than the %d the blob has: %w", s.size, ErrSize)
	case err == io.EOF:
		return nil
	case err == nil:
		return io.ErrNoProgress
	}
	return err
}

// inOrder says whether the ranges of a Range header v, for a blob of size bytes, come
// in ascending order without overlap (or are one range, or none, or do not parse:
// http.ServeContent answers those). Ranges starting past the end are left out, as
// ServeContent leaves them.
func inOrder(v string, size int64) bool {
	specs, ok := strings.CutPrefix(v, "bytes=")
	if !ok || !strings.Contains(specs, ",") {
		return true
	}
	var end int64
	for _, spec := range strings.Split(specs, ",") {
		spec = textproto.TrimString(spec)
		if spec == "" {
			continue
		}
		first, last, ok := strings.Cut(spec, "-")
		if !ok {
			return true
		}
		first, last = textproto.TrimString(first), textproto.TrimString(last)
		var start, stop int64 // [start, stop)
		if first == "" {
			n, err := strconv.ParseInt(last, 10, 64)
			if err != nil || n < 0 {
				return true
			}
			start, stop = max(size-n, 0), size
		} else {
			var err error
			start, err = strconv.ParseInt(first, 10, 64)
			if err != nil || start < 0 {
				return true
			}
			if start >= size {
				continue
			}
			stop = size
			if last != "" {
				l, err := strconv.ParseInt(last, 10, 64)
				if err != nil || l < start {
					return true
				}
				stop = min(l+1, size)
			}
		}
		if start < end {
			return false
		}
		end = stop
	}
	return true
}

// holdback passes an answer on, keeping its last keep bytes until flush.
type holdback struct {
	http.ResponseWriter
	buf    []byte
	keep   int
	status int
}

func (h *holdback) WriteHeader(code int) {
	if h.status == 0 {
		h.status = code
	}
	h.ResponseWriter.WriteHeader(code)
}

func (h *holdback) Write(p []byte) (int, error) {
	if h.status == 0 {
		h.status = http.StatusOK
	}
	h.buf = append(h.buf, p...)
	if over := len(h.buf) - h.keep; over > 0 {
		if _, err := h.ResponseWriter.Write(h.buf[:over]); err != nil {
			return 0, err
		}
		h.buf = append(h.buf[:0], h.buf[over:]...)
	}
	return len(p), nil
}

func (h *holdback) flush() error {
	_, err := h.ResponseWriter.Write(h.buf)
	h.buf = nil
	return err
}
