package mirror

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

// halfSource sends each blob's first half, then nothing until gate is closed (or the
// fill ends): a fill under way for as long as a test needs.
type halfSource struct {
	*fakeSource
	gate chan struct{}
}

func (s halfSource) Blob(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, want int64) (io.ReadCloser, int64, error) {
	rc, size, err := s.fakeSource.Blob(ctx, repo, chain, d, want)
	if err != nil {
		return nil, 0, err
	}
	return io.NopCloser(&gated{ctx: ctx, r: rc, half: size / 2, gate: s.gate}), size, nil
}

type gated struct {
	ctx  context.Context
	r    io.Reader
	n    int64
	half int64
	gate chan struct{}
}

func (g *gated) Read(p []byte) (int, error) {
	if g.n >= g.half {
		select {
		case <-g.gate:
		case <-g.ctx.Done():
			return 0, g.ctx.Err()
		}
	} else {
		p = p[:min(int64(len(p)), g.half-g.n)]
	}
	n, err := g.r.Read(p)
	g.n += int64(n)
	return n, err
}

// rangeCase is a Range header and what answers it, for a blob of size bytes: the
// status, and for a 206 the bytes [from, to) with Content-Range "bytes from-(to-1)/size".
type rangeCase struct {
	header   string
	status   int
	from, to int64
}

func rangeCases(size int64) []rangeCase {
	return []rangeCase{
		{"bytes=500-1499", http.StatusPartialContent, 500, 1500},
		{"bytes=-500", http.StatusPartialContent, size - 500, size},
		{"bytes=1000-", http.StatusPartialContent, 1000, size},
		{"bytes=0-0", http.StatusPartialContent, 0, 1},
		{fmt.Sprintf("bytes=%d-%d", size-100, size+1000), http.StatusPartialContent, size - 100, size},
		{fmt.Sprintf("bytes=%d-", size), http.StatusRequestedRangeNotSatisfiable, 0, 0},
		{fmt.Sprintf("bytes=%d-%d", size+10, size+20), http.StatusRequestedRangeNotSatisfiable, 0, 0},
		{"", http.StatusOK, 0, size},
	}
}

// getRange asks srv for blob d with the Range header h (none when empty), and reads
// the whole answer.
func getRange(t *testing.T, method, url, h string) (*http.Response, []byte, error) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	if h != "" {
		req.Header.Set("Range", h)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// check says what is wrong with an answer to c, for blob whole.
func (c rangeCase) check(resp *http.Response, body []byte, whole []byte, head bool) error {
	size := int64(len(whole))
	if resp.StatusCode != c.status {
		return fmt.Errorf("status %d, want %d", resp.StatusCode, c.status)
	}
	if got := resp.Header.Get("Accept-Ranges"); got != "bytes" {
		return fmt.Errorf("Accept-Ranges %q, want bytes", got)
	}
	switch c.status {
	case http.StatusRequestedRangeNotSatisfiable:
		if want := fmt.Sprintf("bytes */%d", size); resp.Header.Get("Content-Range") != want {
			return fmt.Errorf("Content-Range %q, want %q", resp.Header.Get("Content-Range"), want)
		}
		return nil
	case http.StatusPartialContent:
		if want := fmt.Sprintf("bytes %d-%d/%d", c.from, c.to-1, size); resp.Header.Get("Content-Range") != want {
			return fmt.Errorf("Content-Range %q, want %q", resp.Header.Get("Content-Range"), want)
		}
	}
	if want := strconv.FormatInt(c.to-c.from, 10); resp.Header.Get("Content-Length") != want {
		return fmt.Errorf("Content-Length %q, want %s", resp.Header.Get("Content-Length"), want)
	}
	if head {
		if len(body) > 0 {
			return fmt.Errorf("a HEAD answered %d bytes", len(body))
		}
		return nil
	}
	if !bytes.Equal(body, whole[c.from:c.to]) {
		return fmt.Errorf("%d bytes that are not bytes %d to %d of the blob", len(body), c.from, c.to)
	}
	return nil
}

// Every Range form is answered with exactly the bytes asked (206), 416 with
// "bytes */size" for a range the blob cannot meet, and Accept-Ranges: from the store,
// to GET and HEAD, and while the blob is being filled (each case the first request
// for the blob, which starts the fill).
func TestRangesAreServedExactly(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	md := digest.Digest(d.String())
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	whole := src.blobs[digest.Digest(ld.String())]
	pinned := func(_ string, dd digest.Digest) bool { return dd == md }
	stand := func(t *testing.T, src Source) served {
		s := serve(t, src, pinned)
		resp, err := http.Get(s.srv.URL + "/v2/" + repo + "/manifests/" + d.String())
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("manifest: %v %v", resp, err)
		}
		resp.Body.Close()
		return s
	}
	url := func(s served) string { return s.srv.URL + "/v2/" + repo + "/blobs/" + ld.String() }
	t.Run("WhileFilled", func(t *testing.T) {
		for _, c := range rangeCases(int64(len(whole))) {
			s := stand(t, slowSource{src})
			resp, body, err := getRange(t, http.MethodGet, url(s), c.header)
			if err == nil {
				err = c.check(resp, body, whole, false)
			}
			if err != nil {
				t.Errorf("%q while filled: %v", c.header, err)
			}
		}
	})
	t.Run("Stored", func(t *testing.T) {
		s := stand(t, src)
		if _, _, err := getRange(t, http.MethodGet, url(s), ""); err != nil {
			t.Fatal(err)
		}
		if _, ok := s.store.Size(context.Background(), digest.Digest(ld.String())); !ok {
			t.Fatal("the blob is not stored")
		}
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			for _, c := range rangeCases(int64(len(whole))) {
				resp, body, err := getRange(t, method, url(s), c.header)
				if err == nil {
					err = c.check(resp, body, whole, method == http.MethodHead)
				}
				if err != nil {
					t.Errorf("%s %q from the store: %v", method, c.header, err)
				}
			}
		}
	})
}

// Several ranges in one request: in ascending order, without overlap (as
// containers/image's partial pulls ask), one multipart/byteranges answer with each;
// otherwise the whole blob (200).
func TestSeveralRangesInOneRequest(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	md := digest.Digest(d.String())
	s := serve(t, src, func(_ string, dd digest.Digest) bool { return dd == md })
	resp, _ := http.Get(s.srv.URL + "/v2/" + repo + "/manifests/" + d.String())
	resp.Body.Close()
	layers, _ := img.Layers()
	ld, _ := layers[1].Digest()
	whole := src.blobs[digest.Digest(ld.String())]
	url := s.srv.URL + "/v2/" + repo + "/blobs/" + ld.String()
	for _, when := range []string{"while filled", "stored"} {
		resp, body, err := getRange(t, http.MethodGet, url, "bytes=0-99,1000-1099,-10")
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if resp.StatusCode != http.StatusPartialContent {
			t.Fatalf("%s: ascending ranges: status %d, want 206", when, resp.StatusCode)
		}
		mt, params, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
		if err != nil || mt != "multipart/byteranges" {
			t.Fatalf("%s: Content-Type %q", when, resp.Header.Get("Content-Type"))
		}
		mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
		size := int64(len(whole))
		for _, want := range [][2]int64{{0, 100}, {1000, 1100}, {size - 10, size}} {
			p, err := mr.NextPart()
			if err != nil {
				t.Fatalf("%s: part %v: %v", when, want, err)
			}
			got, _ := io.ReadAll(p)
			if cr := fmt.Sprintf("bytes %d-%d/%d", want[0], want[1]-1, size); p.Header.Get("Content-Range") != cr || !bytes.Equal(got, whole[want[0]:want[1]]) {
				t.Fatalf("%s: part %q, %d bytes; want %q", when, p.Header.Get("Content-Range"), len(got), cr)
			}
		}
		if _, err := mr.NextPart(); err != io.EOF {
			t.Fatalf("%s: a part more: %v", when, err)
		}
	}
	for _, h := range []string{"bytes=1000-1099,0-99", "bytes=0-99,50-149"} {
		resp, body, err := getRange(t, http.MethodGet, url, h)
		if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(body, whole) {
			t.Fatalf("%q: status %d, %d bytes, %v; want the whole blob, 200", h, resp.StatusCode, len(body), err)
		}
	}
}

// A range is served while the blob is filled, but its end only once the whole blob
// matches its digest: a range within the part that came waits for the rest; and from a
// source sending wrong bytes, a range is cut, never answered whole.
func TestARangeWaitsForTheFillToMatch(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	md := digest.Digest(d.String())
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	whole := src.blobs[digest.Digest(ld.String())]
	pinned := func(_ string, dd digest.Digest) bool { return dd == md }
	for _, corrupt := range []bool{false, true} {
		gate := make(chan struct{})
		fake := &fakeSource{manifest: src.manifest, mediaType: src.mediaType, blobs: src.blobs, corrupt: corrupt}
		s := serve(t, halfSource{fake, gate}, pinned)
		resp, _ := http.Get(s.srv.URL + "/v2/" + repo + "/manifests/" + d.String())
		resp.Body.Close()
		type answer struct {
			resp *http.Response
			body []byte
			err  error
		}
		done := make(chan answer, 1)
		go func() {
			resp, body, err := getRange(t, http.MethodGet, s.srv.URL+"/v2/"+repo+"/blobs/"+ld.String(), "bytes=100-199")
			done <- answer{resp, body, err}
		}()
		select {
		case a := <-done:
			t.Fatalf("corrupt %t: a range answered before the fill ended: %v, %d bytes", corrupt, a.err, len(a.body))
		case <-time.After(300 * time.Millisecond):
		}
		close(gate)
		a := <-done
		switch {
		case corrupt && a.err == nil:
			t.Fatalf("a range of a blob that does not match its digest answered whole: %d bytes", len(a.body))
		case !corrupt && (a.err != nil || a.resp.StatusCode != http.StatusPartialContent || !bytes.Equal(a.body, whole[100:200])):
			t.Fatalf("the range once the fill matched: %v, %d bytes", a.err, len(a.body))
		}
	}
}

// A stored blob corrupted on disk is checked whole when a range of it is served: the
// range is cut (never answered whole), and the blob leaves the store.
func TestARangeOfACorruptedStoredBlobIsCut(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	s := serve(t, src, func(r string, dd digest.Digest) bool { return dd.String() == d.String() })
	pullThrough(t, s.srv, repo, d)
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	path := filepath.Join(s.dir, "blobs", "sha256", ld.Hex)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)-10] ^= 0xff // after the range asked
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, b, err := getRange(t, http.MethodGet, s.srv.URL+"/v2/"+repo+"/blobs/"+ld.String(), "bytes=0-99"); err == nil {
		t.Fatalf("a range of a corrupted stored blob was answered whole (%d bytes)", len(b))
	}
	if _, ok := s.store.Size(context.Background(), digest.Digest(ld.String())); ok {
		t.Fatal("the corrupted blob is still stored")
	}
}
