package sourcetest

import (
	"bytes"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/mirror"
)

// mirrorOver is a node-local mirror filling from src, pinning what o pins, in a store
// of its own, with o's index and image manifest served through it (so that the blobs
// they name may be): the URL of blob requests, less the digest.
func mirrorOver(t *testing.T, o *Origin, src mirror.Source, name string) string {
	t.Helper()
	store, err := blobstore.Open(filepath.Join(o.TempDir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	m := mirror.New(store, o.Pinned, log)
	t.Cleanup(m.Close) // after the server: the fills under way end
	srv := httptest.NewServer(m.Handler(src, &mirror.Stats{}))
	t.Cleanup(srv.Close)
	base := srv.URL + "/v2/" + mirror.PathFor(o.Repo)
	for _, d := range []fmt.Stringer{o.Index, o.Image} {
		resp, err := http.Get(base + "/manifests/" + d.String())
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("manifest %s through the mirror: %s", d, resp.Status)
		}
	}
	return base + "/blobs/"
}

// byteRange is a Range header and its answer for a blob of some size: a 206 with the
// bytes [from, to), a 416, or (several ranges) a multipart 206 with parts.
type byteRange struct {
	header   string
	status   int
	from, to int64
	parts    [][2]int64
}

func byteRanges(size int64) []byteRange {
	return []byteRange{
		{header: "bytes=500-1499", status: http.StatusPartialContent, from: 500, to: 1500},
		{header: "bytes=-500", status: http.StatusPartialContent, from: size - 500, to: size},
		{header: "bytes=1000-", status: http.StatusPartialContent, from: 1000, to: size},
		{header: fmt.Sprintf("bytes=%d-%d", size-100, size+1000), status: http.StatusPartialContent, from: size - 100, to: size},
		{header: fmt.Sprintf("bytes=%d-", size), status: http.StatusRequestedRangeNotSatisfiable},
		{header: "bytes=0-99,1000-1099", status: http.StatusPartialContent, parts: [][2]int64{{0, 100}, {1000, 1100}}},
	}
}

// rangeAnswer checks the mirror's answer at url to c, for blob whole.
func rangeAnswer(url string, c byteRange, whole []byte) error {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Range", c.header)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("the answer (%s) cut after %d bytes: %w", resp.Status, len(body), err)
	}
	size := int64(len(whole))
	switch {
	case resp.StatusCode != c.status:
		return fmt.Errorf("status %d, want %d", resp.StatusCode, c.status)
	case resp.Header.Get("Accept-Ranges") != "bytes":
		return fmt.Errorf("Accept-Ranges %q, want bytes", resp.Header.Get("Accept-Ranges"))
	case c.status == http.StatusRequestedRangeNotSatisfiable:
		if want := fmt.Sprintf("bytes */%d", size); resp.Header.Get("Content-Range") != want {
			return fmt.Errorf("Content-Range %q, want %q", resp.Header.Get("Content-Range"), want)
		}
		return nil
	case c.parts != nil:
		mt, params, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
		if err != nil || mt != "multipart/byteranges" {
			return fmt.Errorf("Content-Type %q, want multipart/byteranges", resp.Header.Get("Content-Type"))
		}
		mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
		for _, p := range c.parts {
			part, err := mr.NextPart()
			if err != nil {
				return fmt.Errorf("part %d-%d: %w", p[0], p[1]-1, err)
			}
			got, _ := io.ReadAll(part)
			if want := fmt.Sprintf("bytes %d-%d/%d", p[0], p[1]-1, size); part.Header.Get("Content-Range") != want || !bytes.Equal(got, whole[p[0]:p[1]]) {
				return fmt.Errorf("part %q, %d bytes; want %q and its bytes", part.Header.Get("Content-Range"), len(got), want)
			}
		}
		if _, err := mr.NextPart(); err != io.EOF {
			return fmt.Errorf("a part more than asked: %v", err)
		}
		return nil
	}
	if want := fmt.Sprintf("bytes %d-%d/%d", c.from, c.to-1, size); resp.Header.Get("Content-Range") != want {
		return fmt.Errorf("Content-Range %q, want %q", resp.Header.Get("Content-Range"), want)
	}
	if want := strconv.FormatInt(c.to-c.from, 10); resp.Header.Get("Content-Length") != want {
		return fmt.Errorf("Content-Length %q, want %s", resp.Header.Get("Content-Length"), want)
	}
	if !bytes.Equal(body, whole[c.from:c.to]) {
		return fmt.Errorf("%d bytes that are not bytes %d to %d of the blob", len(body), c.from, c.to-1)
	}
	return nil
}

// fetchURL is the whole body at url, with an error unless it came whole with a 200.
func fetchURL(url string) ([]byte, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s", resp.Status)
	}
	return b, err
}
