package httpserve

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

func TestRunServesUntilTheContextEnds(t *testing.T) {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	}()
	var body []byte
	for i := 0; i < 100; i++ {
		if resp, err := http.Get("http://" + addr + "/"); err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if string(body) != "ok" {
		t.Fatalf("served %q", body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after the context ended: %v", err)
	}
	if err := Run(context.Background(), "256.0.0.1:1", http.NotFoundHandler()); err == nil {
		t.Fatal("a bad address was accepted")
	}
}
