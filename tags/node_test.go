package tags

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/tags/check"
	"github.com/imagepin/imagepin/tags/endpoint"
	"github.com/imagepin/imagepin/tags/keep"
)

var (
	pinned = digest.FromString("pinned")
	moved  = digest.FromString("moved")
	tag    = pinset.Tag{Name: "quay.io/x/a:v1", Image: "quay.io/x/a@" + pinned.String()}
)

// fakeRuntime holds every tag it is asked to; first says whether the endpoint answered when
// the keeper first asked (the keeper's pull goes through it on CRI-O).
type fakeRuntime struct {
	endpoint string
	mu       sync.Mutex
	ensured  int
	first    *bool
}

func (r *fakeRuntime) Ensure(context.Context, pinset.Tag) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ensured++
	if r.first == nil && r.endpoint != "" {
		c, err := net.Dial("tcp", r.endpoint)
		if err == nil {
			c.Close()
		}
		ok := err == nil
		r.first = &ok
	}
	return true, nil
}

func (r *fakeRuntime) Forget(context.Context, []pinset.Tag) error { return nil }

func (r *fakeRuntime) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ensured
}

// reg is a registry where every tag has moved on.
type reg struct{}

func (reg) ResolveTag(context.Context, string) (registry.Tag, error) {
	return registry.Tag{Digest: moved}, nil
}

func node(t *testing.T, rt keep.Runtime, address string, onChange func()) *Node {
	t.Helper()
	log := logrus.New()
	keeper := keep.New(keep.Config{}, rt, nil, log)
	keeper.Want([]pinset.Tag{tag})
	p := Parts{Keeper: keeper, Checker: check.New(check.Config{}, reg{}, keeper.Tags, nil, log)}
	if address != "" {
		ca, err := endpoint.LoadCA(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		p.Endpoint = &endpoint.Server{Address: address, CA: ca, Handler: http.NotFoundHandler(), Log: log}
	}
	return New(p, onChange)
}

func run(t *testing.T, n *Node) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	return func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run: %v, want nil once the context ends", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Run still running 5 s after its context ended")
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5 s for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Another process holds the tag endpoint's address: the node's status says so (and the
// agent is told to publish it), no tag is pulled (it would not come from the endpoint),
// the check runs on, and Run ends with its context.
func TestEndpointAddressHeldIsAFaultAndNoTagIsPulled(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	rt := &fakeRuntime{}
	// A change announced once the fault is there (the checker announces its own changes
	// too: the tag moved).
	var n *Node
	var announced atomic.Bool
	n = node(t, rt, held.Addr().String(), func() {
		if _, faults := n.Status(); len(faults) > 0 {
			announced.Store(true)
		}
	})
	stop := run(t, n)
	waitFor(t, "a change announced with the endpoint's fault", announced.Load)
	waitFor(t, "the check to find the tag moved", func() bool { st, _ := n.Status(); return len(st.Moved) == 1 })
	st, faults := n.Status()
	if len(faults) != 1 || !strings.Contains(faults[0], "tag endpoint "+held.Addr().String()) || !strings.Contains(faults[0], "not pre-loaded") {
		t.Fatalf("faults %q, want the endpoint's address named", faults)
	}
	if st.Pinned != 1 || st.Held != 0 || !st.Kept {
		t.Fatalf("status %+v, want 1 pinned, none held", st)
	}
	time.Sleep(100 * time.Millisecond)
	if c := rt.count(); c != 0 {
		t.Fatalf("the keeper asked the runtime for tags %d times with no endpoint to pull them through", c)
	}
	stop()
}

// The endpoint served: it listens before the keeper's first pull, answers TLS with the
// node's CA, and every part stops with the context (the address is free again).
func TestRunServesTheEndpointAndStopsWithTheContext(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	address := l.Addr().String()
	l.Close()
	rt := &fakeRuntime{endpoint: address}
	n := node(t, rt, address, nil)
	stop := run(t, n)
	waitFor(t, "the keeper to hold the tag", func() bool { st, _ := n.Status(); return st.Held == 1 })
	rt.mu.Lock()
	first := rt.first
	rt.mu.Unlock()
	if first == nil || !*first {
		t.Fatal("the keeper pulled before the endpoint listened")
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(n.endpoint.CA.PEM())
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 5 * time.Second}
	resp, err := client.Get("https://" + address + "/v2/")
	if err != nil {
		t.Fatalf("the endpoint over TLS with the node's CA: %v", err)
	}
	resp.Body.Close()
	client.CloseIdleConnections()
	if _, faults := n.Status(); len(faults) != 0 {
		t.Fatalf("faults %q with the endpoint served", faults)
	}
	stop()
	again, err := net.Listen("tcp", address)
	if err != nil {
		t.Fatalf("the endpoint's address still held after Run returned: %v", err)
	}
	again.Close()
}

// Status: nothing while no tag is pinned; a keeper without a runtime (CRI-O without the
// endpoint) says why the pinned tags are not pre-loaded.
func TestStatus(t *testing.T) {
	n := node(t, nil, "", nil)
	st, faults := n.Status()
	if st == nil || st.Kept || st.Pinned != 1 || len(faults) != 1 || !strings.Contains(faults[0], "1 pinned tags are not pre-loaded") {
		t.Fatalf("keeper without a runtime: %+v %q", st, faults)
	}
	n.Want(nil)
	if st, faults := n.Status(); st != nil || faults != nil {
		t.Fatalf("no tag pinned: %+v %q", st, faults)
	}
	stop := run(t, n) // no runtime, no endpoint: Run waits for its context
	stop()
}
