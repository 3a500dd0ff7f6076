package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/peers"
)

// The busiest node's uploads are told apart: a copy to a child of the blob's tree over
// every node, and one to a node whose parent is another; manifests apart; the share of
// all uploads that went to a tree child.
func TestUploadsExplained(t *testing.T) {
	addrs := []string{"127.10.0.1:1", "127.10.0.2:1", "127.10.0.3:1", "127.10.0.4:1", "127.10.0.5:1", "127.10.0.6:1", "127.10.0.7:1"}
	blob := digest.FromString("base")
	order := peers.Order(blob, addrs)
	index := func(a string) int {
		for i, x := range addrs {
			if x == a {
				return i
			}
		}
		t.Fatalf("%s not an address", a)
		return -1
	}
	head := index(order[0])
	child1, child2 := index(order[1]), index(order[2]) // the head's children (fanout 2)
	grandchild := index(order[3])                      // child1's children: 3 and 4
	const size = 1000
	entries := []servedEntry{
		{Node: head, Asker: child1, Blob: blob.String(), Bytes: size},
		{Node: head, Asker: child2, Blob: blob.String(), Bytes: size},
		{Node: head, Asker: grandchild, Blob: blob.String(), Bytes: size},
		{Node: head, Asker: child1, Blob: "manifests", Bytes: size},
		{Node: child1, Asker: index(order[4]), Blob: blob.String(), Bytes: size},
	}
	got := uploadsExplained(entries, addrs, 2, map[string]int64{blob.String(): size})
	t.Log(got)
	for _, want := range []string{
		"60.0% of the bytes nodes sent peers went to a child", // 3 of the 4 blob copies, and a manifest
		"manifests 0.001 MiB",
		"3.00 copies",
		"not its child (its parent node-",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q", want)
		}
	}
	if n := strings.Count(got, ", its child;"); n != 2 {
		t.Errorf("%d askers called its child, want 2", n)
	}
}

// A node's peer server is counted by blob and by the asking node's certificate name.
func TestServedCountsByBlobAndAsker(t *testing.T) {
	var s served
	h := s.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(make([]byte, 42)) }))
	for _, p := range []string{"/v2/r/blobs/sha256:aa", "/v2/r/blobs/sha256:aa", "/v2/r/manifests/sha256:bb"} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, p, nil))
	}
	got := map[string]int64{}
	for _, e := range s.entries(3) {
		if e.Node != 3 || e.Asker != -1 {
			t.Errorf("entry %+v: want node 3, asker unknown (no certificate)", e)
		}
		got[e.Blob] += e.Bytes
	}
	if got["sha256:aa"] != 84 || got["manifests"] != 42 {
		t.Errorf("counted %v", got)
	}
}
