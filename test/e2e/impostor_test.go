//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	contentapi "github.com/containerd/containerd/api/services/content/v1"
	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// impostor is a local process that bound the node-local mirror's port while imagepind
// was down, serving one image (B) of its choosing:
//   - smart: B's manifest for every tag, and B's manifest and blobs by their digests; a
//     404 for anything else, so that containerd goes on to the next host and the pull
//     works, only ever with B where the impostor is asked for a tag. The strongest
//     impostor for "can it choose a tag's image?";
//   - every (smart false): B's manifest, with B's digest in Docker-Content-Digest, for
//     every /v2/ request whatever it asks (tags, other digests, blobs).
type impostor struct {
	srv       *http.Server
	manifest  []byte
	mediaType string
	digest    string
	blobs     map[string][]byte

	mu    sync.Mutex
	smart bool
	seen  impostorSeen
	log   []string
}

// impostorSeen counts what containerd asked the impostor.
type impostorSeen struct {
	TagManifests    int // GET/HEAD …/manifests/<tag>: what a pull-only host is never asked
	DigestManifests int // …/manifests/sha256:…
	Blobs           int // …/blobs/sha256:…
	Other           int
}

// startImpostor loads image ref (a digest reference on an insecure registry) and
// serves it on addr, taking the address as soon as it is free (imagepind just let go of
// it).
func startImpostor(t *testing.T, addr, ref string) *impostor {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r)
	if err != nil {
		t.Fatal(err)
	}
	im := &impostor{blobs: map[string][]byte{}, smart: true}
	if im.manifest, err = img.RawManifest(); err != nil {
		t.Fatal(err)
	}
	mt, _ := img.MediaType()
	im.mediaType = string(mt)
	d, _ := img.Digest()
	im.digest = d.String()
	cn, _ := img.ConfigName()
	cfg, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	im.blobs[cn.String()] = cfg
	layers, _ := img.Layers()
	for _, l := range layers {
		ld, _ := l.Digest()
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		im.blobs[ld.String()] = b
	}
	var l net.Listener
	deadline := time.Now().Add(10 * time.Second)
	for {
		if l, err = net.Listen("tcp", addr); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the impostor cannot bind the mirror's address %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	im.srv = &http.Server{Handler: im}
	go im.srv.Serve(l)
	t.Cleanup(im.close)
	return im
}

func (im *impostor) close() { im.srv.Close() }

// setSmart switches the impostor's mode and clears its counts.
func (im *impostor) setSmart(smart bool) {
	im.mu.Lock()
	defer im.mu.Unlock()
	im.smart, im.seen, im.log = smart, impostorSeen{}, nil
}

// counts is what it was asked since the last setSmart, and the requests themselves.
func (im *impostor) counts() (impostorSeen, []string) {
	im.mu.Lock()
	defer im.mu.Unlock()
	return im.seen, append([]string(nil), im.log...)
}

func (im *impostor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	im.mu.Lock()
	smart := im.smart
	im.log = append(im.log, r.Method+" "+r.URL.RequestURI())
	kind, ref := "other", ""
	if i := strings.LastIndex(r.URL.Path, "/manifests/"); i >= 0 {
		ref = r.URL.Path[i+len("/manifests/"):]
		if strings.HasPrefix(ref, "sha256:") {
			kind = "digest"
			im.seen.DigestManifests++
		} else {
			kind = "tag"
			im.seen.TagManifests++
		}
	} else if i := strings.LastIndex(r.URL.Path, "/blobs/"); i >= 0 {
		kind, ref = "blob", r.URL.Path[i+len("/blobs/"):]
		im.seen.Blobs++
	} else {
		im.seen.Other++
	}
	im.mu.Unlock()

	serve := func(b []byte, mediaType, digest string) {
		w.Header().Set("Content-Type", mediaType)
		w.Header().Set("Docker-Content-Digest", digest)
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			w.Write(b)
		}
	}
	switch {
	case !strings.HasPrefix(r.URL.Path, "/v2/"):
		http.NotFound(w, r)
	case !smart:
		serve(im.manifest, im.mediaType, im.digest)
	case r.URL.Path == "/v2/":
		w.WriteHeader(http.StatusOK)
	case kind == "tag" || (kind == "digest" && ref == im.digest):
		serve(im.manifest, im.mediaType, im.digest)
	case kind == "blob" && im.blobs[ref] != nil:
		serve(im.blobs[ref], "application/octet-stream", ref)
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"errors":[{"code":"MANIFEST_UNKNOWN","message":"not here"}]}`)
	}
}

// recordTarget is the digest of the manifest containerd's image record name (in the
// CRI plugin's k8s.io namespace) points at: the image a pulled tag became; "" when
// there is no such record.
func recordTarget(t *testing.T, socket, name string) string {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "containerd-namespace", "k8s.io"), 10*time.Second)
	defer cancel()
	resp, err := imagesapi.NewImagesClient(conn).Get(ctx, &imagesapi.GetImageRequest{Name: name})
	if err != nil {
		if strings.Contains(err.Error(), "not found") {
			return ""
		}
		t.Fatalf("image record %s: %v", name, err)
	}
	return resp.Image.Target.Digest
}

// abortIngests aborts every ingest containerd holds in the k8s.io namespace (as
// "ctr -n k8s.io content active" lists them) and returns how many there were.
func abortIngests(t *testing.T, socket string) int {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "containerd-namespace", "k8s.io"), 10*time.Second)
	defer cancel()
	cc := contentapi.NewContentClient(conn)
	resp, err := cc.ListStatuses(ctx, &contentapi.ListStatusesRequest{})
	if err != nil {
		t.Fatalf("list containerd's ingests: %v", err)
	}
	n := len(resp.Statuses)
	for _, st := range resp.Statuses {
		if _, err := cc.Abort(ctx, &contentapi.AbortRequest{Ref: st.Ref}); err != nil && !strings.Contains(err.Error(), "not found") {
			t.Fatalf("abort ingest %s: %v", st.Ref, err)
		}
	}
	if resp, err = cc.ListStatuses(ctx, &contentapi.ListStatusesRequest{}); err != nil || len(resp.Statuses) != 0 {
		t.Fatalf("ingests left after aborting them: %v %v", resp, err)
	}
	return n
}
