package agent

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/imagepin/imagepin/diskcheck"
	"github.com/imagepin/imagepin/status"
)

// askedDisk admits every set and records what each check was asked.
type askedDisk struct {
	mu    sync.Mutex
	asked [][]diskcheck.SetRequest
}

func (d *askedDisk) Check(_ context.Context, sets []diskcheck.SetRequest, _ func(diskcheck.Early)) (diskcheck.Result, error) {
	d.mu.Lock()
	d.asked = append(d.asked, sets)
	d.mu.Unlock()
	res := diskcheck.Result{Verdicts: map[string]diskcheck.Verdict{}}
	for _, s := range sets {
		res.Verdicts[s.Name] = diskcheck.Verdict{Admitted: true,
			Condition: status.Condition{Type: status.ConditionDiskChecked, Status: status.True, Reason: status.ReasonSpaceAvailable, Message: "fits"}}
	}
	return res, nil
}

// The disk check is told the images the runtime holds already, besides those it
// misses: the node-local mirror's store keeps the blobs of those too, and the check
// counts what it lacks of them.
func TestTheDiskCheckIsToldThePresentImages(t *testing.T) {
	h := newHarness(t)
	disk := &askedDisk{}
	h.disk = disk
	running, next := img("running", 1), img("next", 2)
	h.available(running, next)
	if _, err := h.rt.PullImage(context.Background(), running, nil); err != nil { // the kubelet pulled it
		t.Fatal(err)
	}
	h.start()
	h.writeFile("s.yaml", setDoc("s", running, next))
	h.waitFor("Ready", phase("s", status.Ready))
	disk.mu.Lock()
	defer disk.mu.Unlock()
	first := disk.asked[0]
	if len(first) != 1 || !slices.Equal(first[0].Missing, []string{next}) || !slices.Equal(first[0].Present, []string{running}) {
		t.Fatalf("the first check was asked %+v; want %s missing and %s present", first, next, running)
	}
}
