package peers

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// The node-local mirror answers only the users its check allows: Serve wraps its
// loopback listener with the socket owner's check (sockowner), so a connection the
// check refuses is closed before the mirror sees a request; one it allows is served.
func TestServeAnswersOnlyTheUsersItAllows(t *testing.T) {
	for _, c := range []struct {
		name  string
		allow bool
	}{{"refused", false}, {"allowed", true}} {
		t.Run(c.name, func(t *testing.T) {
			addr := freeAddr(t)
			n := newNode(t, Config{MirrorAddress: addr})
			n.Bind(Runtime{Registry: newRegistry(t, 1, 1<<10)})
			asked := make(chan int, 16)
			n.allow = func(uid int) bool { asked <- uid; return c.allow }
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- n.Serve(ctx) }()
			t.Cleanup(func() {
				cancel()
				<-done
			})
			client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			var resp *http.Response
			var err error
			for range 100 {
				if resp, err = client.Get("http://" + addr + "/v2/"); err == nil || len(asked) > 0 {
					break
				}
				time.Sleep(20 * time.Millisecond) // not listening yet
			}
			if resp != nil {
				resp.Body.Close()
			}
			if len(asked) == 0 {
				t.Fatalf("the check was never asked (%v): the loopback mirror answers every local user", err)
			}
			switch {
			case c.allow && (err != nil || resp.StatusCode != http.StatusOK):
				t.Fatalf("an allowed connection: %v %v", resp, err)
			case !c.allow && err == nil:
				t.Fatalf("a connection the check refuses was answered: %s", resp.Status)
			}
		})
	}
}
