package main

import (
	"errors"
	"io"
	"net/http"
	"testing"
)

// A node's mirror reached in memory answers HTTP as over TCP, and refuses dials once
// its listener is closed.
func TestPipeListenerServesHTTP(t *testing.T) {
	l := newPipeListener()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "blob "+r.URL.Path)
	})}
	go srv.Serve(l)
	client := &http.Client{Transport: &http.Transport{DialContext: l.dial}}
	for range 3 { // the connection is kept and reused
		resp, err := client.Get("http://mirror.local/v2/a/blobs/x")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "blob /v2/a/blobs/x" {
			t.Fatalf("got %q", body)
		}
	}
	srv.Close()
	client.CloseIdleConnections()
	if _, err := l.dial(t.Context(), "tcp", "mirror.local:80"); !errors.Is(err, errPipeClosed) {
		t.Fatalf("dial after close: %v, want errPipeClosed", err)
	}
}

func TestUploadsByCopies(t *testing.T) {
	got := uploads([]int64{0, 50, 100, 199, 200, 201, 350}, 100)
	want := "≤0.5: 2, ≤1: 1, ≤1.5: 0, ≤2: 2, ≤3: 1, >3: 1 nodes"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
