package report

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/imagepin/imagepin/internal/testcerts"
	"github.com/imagepin/imagepin/status"
)

// A client certificate missing at start (a fresh node, its CSR not approved yet) does
// not switch reporting off: once the file appears, the reporter goes on to report.
func TestMissingCertificateIsWaitedFor(t *testing.T) {
	dir := t.TempDir()
	cert := filepath.Join(dir, "w1.pem") // where testcerts writes it below
	ca, err := testcerts.NewCA(dir, "kubelet-client-ca")
	if err != nil {
		t.Fatal(err)
	}
	log, hook := test.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	r := New(Config{Aggregator: "127.0.0.1:1", CertFile: cert, Heartbeat: 200 * time.Millisecond}, log)
	r.Update(status.Node{Node: status.NodeInfo{Name: "w1"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()

	select {
	case err := <-done:
		t.Fatalf("Run gave up on a missing certificate: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	if !logged(hook, "cannot report yet; retrying until the certificate is there") {
		t.Fatal("the wait is not logged")
	}
	if _, err := ca.Node(dir, "w1"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !logged(hook, "report failed; retrying with the latest status") { // nothing listens on port 1
		if time.Now().After(deadline) {
			t.Fatal("the reporter did not go on once the certificate appeared")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !logged(hook, "report client certificate available") {
		t.Fatal("the certificate's arrival is not logged")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func logged(hook *test.Hook, msg string) bool {
	for _, e := range hook.AllEntries() {
		if strings.Contains(e.Message, msg) {
			return true
		}
	}
	return false
}
