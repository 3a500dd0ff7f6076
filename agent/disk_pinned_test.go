package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/imagepin/imagepin/diskcheck"
	"github.com/imagepin/imagepin/status"
)

// mirrorDisk sizes an image only once the pin drop-in names it, as the real check does
// on a node joining with the registry gone ([peers]: the node-local mirror serves
// pinned images only, from its peers).
type mirrorDisk struct {
	dropIns string
	clock   *testingclock.FakeClock
	mu      sync.Mutex
	at      []time.Time // when each check ran, on the agent's clock
}

func (d *mirrorDisk) Check(ctx context.Context, sets []diskcheck.SetRequest, _ func(diskcheck.Early)) (diskcheck.Result, error) {
	d.mu.Lock()
	d.at = append(d.at, d.clock.Now())
	d.mu.Unlock()
	var pinned string
	if files, err := os.ReadDir(d.dropIns); err == nil {
		for _, f := range files {
			b, _ := os.ReadFile(filepath.Join(d.dropIns, f.Name()))
			pinned += string(b)
		}
	}
	res := diskcheck.Result{Verdicts: map[string]diskcheck.Verdict{}}
	for _, s := range sets {
		v := diskcheck.Verdict{Admitted: true, Bytes: map[string]uint64{}, Unsized: map[string]string{},
			Condition: status.Condition{Type: status.ConditionDiskChecked, Status: status.True, Reason: status.ReasonSpaceAvailable, Message: "fits"}}
		for _, ref := range s.Missing {
			if strings.Contains(pinned, ref) {
				v.Bytes[ref] = 1
			} else {
				v.Unsized[ref] = errors.New("pinging container registry: connection refused").Error()
				v.Condition.Status = status.Unknown
			}
		}
		res.Verdicts[s.Name] = v
	}
	return res, nil
}

// The first disk check of a node joining with the registry gone sizes nothing (the
// mirror serves only pinned images, and nothing is pinned yet); the pins written after
// it make the check due at once, not after its backoff (at least 0.8 s).
func TestUnsizedImagesAreCheckedAgainOnceThePinsAreWritten(t *testing.T) {
	h := newHarness(t)
	h.cfg.MaxBackoff = time.Hour
	h.cfg.PinWhileChecking = false // [peers]: a pin lets the mirror fill its store
	h.clock = testingclock.NewFakeClock(time.Now())
	disk := &mirrorDisk{dropIns: h.dropIn.ConfigDir, clock: h.clock}
	h.disk = disk
	a, b := img("a", 1), img("b", 2)
	h.available(a, b)
	h.start()
	h.writeFile("s.yaml", setDoc("s", a, b))
	// The clock creeps slowly (1 ms each 10 ms), so a loaded machine cannot move it to the
	// backoff's first retry (0.8 s at the least) while the agent works.
	ready := phase("s", status.Ready)
	for deadline := time.Now().Add(30 * time.Second); !ready(h.latestStatus()); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not Ready: %+v", h.latestStatus())
		}
		h.clock.Step(time.Millisecond)
	}
	disk.mu.Lock()
	defer disk.mu.Unlock()
	if len(disk.at) < 2 {
		t.Fatalf("%d disk checks", len(disk.at))
	}
	if after := disk.at[1].Sub(disk.at[0]); after >= 800*time.Millisecond {
		t.Fatalf("the check that sizes the pinned images ran %s after the first: the backoff's, not at once", after)
	}
}
