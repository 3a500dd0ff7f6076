package agent

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/imagepin/imagepin/containerd"
	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/crio"
	"github.com/imagepin/imagepin/diskcheck"
	"github.com/imagepin/imagepin/kubelet"
	"github.com/imagepin/imagepin/pin"
	"github.com/imagepin/imagepin/release"
	"github.com/imagepin/imagepin/state"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/fakeruntime"
)

func img(repo string, n int) string {
	return fmt.Sprintf("registry.example/%s@sha256:%064x", repo, n)
}

type harness struct {
	t        testing.TB
	root     string
	cfg      Config
	dropIn   crio.DropIn
	rt       *fakeruntime.Runtime
	store    *state.Store
	triggers chan struct{}
	cancel   context.CancelFunc
	done     chan struct{}

	mu       sync.Mutex
	latest   status.Node
	seq      int
	observer Observer
	releases Releases
	// reloader replaces the fake runtime's own reload (a slow one, say).
	reloader reloader
	// disk replaces the admit-everything disk check.
	disk DiskChecker
	// alive is Deps.Alive (the watchdog).
	alive func()
	// clock, when set, drives the agent's time: the test steps it instead of sleeping.
	clock *testingclock.FakeClock
	// runtime replaces the fake runtime's CRI calls (a wrapper that fails some).
	runtime Runtime
	// containerd makes the fake runtime containerd and the pinner containerd's.
	containerd bool
	// kubelet is Deps.Kubelet.
	kubelet func() (kubelet.Verification, error)
	// agent is the running agent (after start).
	agent *Agent
	// tags is Deps.Tags.
	tags Tags
	// sourceSynced is Deps.SourceSynced.
	sourceSynced func() bool
	// seeds is Deps.Seeds.
	seeds func(pinned []string) (*status.Seeded, []string)
	// blobs is Deps.Blobs; holders Deps.Holders (nil: every blob held twice, unless
	// noAggregator).
	blobs        BlobHoldings
	holders      HolderCounts
	noAggregator bool
}

// everyBlobHeld is an aggregator counting two holders of every blob of every set.
type everyBlobHeld struct{}

func (everyBlobHeld) Holders(string) status.BlobHolders {
	return status.BlobHolders{Status: status.True, Images: 1, Blobs: 3}
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	root := t.TempDir()
	h := &harness{t: t, root: root}
	h.cfg = Config{
		NodeName: "worker-0", Architecture: "amd64", Version: "test",
		SetsDir:      filepath.Join(root, "sets.d"),
		LabelsFile:   filepath.Join(root, "labels.json"),
		PullSecret:   filepath.Join(root, "config.json"),
		InlineLabels: map[string]string{"node-role.kubernetes.io/worker": ""},
		UnpinDelay:   300 * time.Millisecond, PullConcurrency: 2, PullTimeout: 5 * time.Second,
		ConfirmTimeout: 2 * time.Second, MaxBackoff: 100 * time.Millisecond,
		PinWhileChecking: true, PullEarly: true,
	}
	h.dropIn = crio.DropIn{MainConfig: filepath.Join(root, "crio", "crio.conf"), ConfigDir: filepath.Join(root, "crio", "crio.conf.d"), Cache: crio.NewFileCache()}
	os.MkdirAll(h.cfg.SetsDir, 0o755)
	os.MkdirAll(h.dropIn.ConfigDir, 0o755)
	h.rt = fakeruntime.New(h.dropIn)
	var err error
	h.store, err = state.Open(filepath.Join(root, "state"))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *harness) start() {
	h.t.Helper()
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	if testing.Verbose() {
		log.SetLevel(logrus.InfoLevel)
	}
	deps := Deps{
		Runtime: h.rt, Disk: diskcheck.AdmitAll{}, State: h.store,
		Publish: func(n status.Node) {
			h.mu.Lock()
			h.latest = n
			h.seq++
			h.mu.Unlock()
		},
		Log:      log,
		Observer: h.observer,
		Releases: h.releases,
		Kubelet:  h.kubelet,
		Tags:     h.tags,

		SourceSynced: h.sourceSynced,
		Seeds:        h.seeds,
		Blobs:        h.blobs,
		Holders:      h.holders,
	}
	if h.holders == nil && !h.noAggregator {
		deps.Holders = everyBlobHeld{}
	}
	p := &crio.Pinner{DropIn: h.dropIn, Live: h.rt, Reloader: h.rt}
	if h.reloader != nil {
		p.Reloader = h.reloader
	}
	deps.Pinners = map[string]pin.Pinner{"cri-o": p}
	if h.containerd {
		deps.Pinners = map[string]pin.Pinner{"containerd": &containerd.Pinner{Images: h.rt, Events: h.rt, Namespace: "k8s.io",
			Record: filepath.Join(h.store.Dir(), "containerd-labels.json"), Log: log}}
	}
	if h.disk != nil {
		deps.Disk = h.disk
	}
	deps.Alive = h.alive
	if h.clock != nil {
		deps.Clock = h.clock
	}
	if h.runtime != nil {
		deps.Runtime = h.runtime
	}
	if h.observer == nil {
		h.observer = &countingObserver{}
		deps.Observer = h.observer
	}
	a := New(h.cfg, deps)
	h.agent = a
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.triggers = make(chan struct{}, 1)
	h.done = make(chan struct{})
	go func() {
		defer close(h.done)
		a.Run(ctx, h.triggers)
	}()
	h.t.Cleanup(h.stop)
}

func (h *harness) stop() {
	if h.cancel != nil {
		h.cancel()
		<-h.done
		h.cancel = nil
	}
}

func (h *harness) trigger() {
	select {
	case h.triggers <- struct{}{}:
	default:
	}
}

func (h *harness) writeFile(name, content string) {
	h.t.Helper()
	// As sync tools do: a hidden temp file renamed into place.
	p := filepath.Join(h.cfg.SetsDir, name)
	if err := os.WriteFile(filepath.Join(h.cfg.SetsDir, ".tmp-"+name), []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(h.cfg.SetsDir, ".tmp-"+name), p); err != nil {
		h.t.Fatal(err)
	}
	h.trigger()
}

// pass triggers the loop and waits until a pass has run after the trigger.
func (h *harness) pass() {
	h.t.Helper()
	obs, ok := h.observer.(*countingObserver)
	if !ok {
		h.t.Fatal("pass needs the counting observer")
	}
	before := obs.count()
	h.trigger()
	deadline := time.Now().Add(10 * time.Second)
	for obs.count() <= before {
		if time.Now().After(deadline) {
			h.t.Fatal("no pass after a trigger")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (h *harness) latestStatus() status.Node {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.latest
}

func (h *harness) waitFor(what string, cond func(status.Node) bool) status.Node {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		h.mu.Lock()
		n := h.latest
		h.mu.Unlock()
		if cond(n) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
		if h.clock != nil {
			// A fake clock creeps while a test waits, so that short timers (the full pass
			// put off while pulls stream in) fire; the waits a test asserts on it steps
			// itself, far beyond this.
			h.clock.Step(5 * time.Millisecond)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.t.Fatalf("timed out waiting for %s; last status: %+v", what, h.latest)
	return status.Node{}
}

func setDoc(name string, images ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: %s}\nspec:\n  pinnedImages:\n", name)
	for _, i := range images {
		fmt.Fprintf(&b, "  - %s\n", i)
	}
	return b.String()
}

func v1Doc(name, pool string, images ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nmetadata:\n  name: %s\n  labels: {machineconfiguration.openshift.io/role: %s}\nspec:\n  pinnedImages:\n", name, pool)
	for _, i := range images {
		fmt.Fprintf(&b, "  - name: %s\n", i)
	}
	return b.String()
}

func phase(name string, p status.Phase) func(status.Node) bool {
	return func(n status.Node) bool {
		s := n.Set(name)
		return s != nil && s.Phase == p
	}
}

func (h *harness) available(images ...string) {
	for _, i := range images {
		h.rt.SetRegistry(i, nil)
	}
}

func TestSetBecomesReadyPinnedAndPulled(t *testing.T) {
	h := newHarness(t)
	a, b := img("a", 1), img("b", 2)
	h.available(a, b)
	h.start()
	h.writeFile("upgrade.yaml", setDoc("upgrade", a, b))
	n := h.waitFor("Ready", phase("upgrade", status.Ready))
	s := n.Set("upgrade")
	if s.ImagesReady != 2 || s.ImagesTotal != 2 || s.File != "upgrade.yaml" || s.UID == "" || s.SpecHash == "" {
		t.Fatalf("%+v", s)
	}
	if c := s.Condition(status.ConditionReady); c.Status != status.True || c.Reason != status.ReasonAllImagesPinned {
		t.Fatalf("ready condition %+v", c)
	}
	if c := s.Condition(status.ConditionDiskChecked); c.Status != status.Unknown || c.Reason != status.ReasonNotImplemented {
		t.Fatalf("disk condition %+v", c)
	}
	if !slices.Contains(h.rt.Pinned(), a) || !slices.Contains(h.rt.Pinned(), b) || !h.rt.Present(a) {
		t.Fatalf("pinned %v", h.rt.Pinned())
	}
	if n.Node.Runtime.Version != "1.34.0" || n.Node.Name != "worker-0" {
		t.Fatalf("node %+v", n.Node)
	}
	// Nothing changes: no further reload, no further pull.
	reloads := h.rt.ReloadCount()
	h.trigger()
	time.Sleep(100 * time.Millisecond)
	if h.rt.ReloadCount() != reloads || h.rt.PullCount(a) != 1 {
		t.Fatalf("idle reconcile reloaded (%d→%d) or pulled again (%d)", reloads, h.rt.ReloadCount(), h.rt.PullCount(a))
	}
}

func TestTwoShapesAdminPinsAndRemoval(t *testing.T) {
	h := newHarness(t)
	a, b, c := img("a", 1), img("b", 2), img("c", 3)
	h.available(a, b, c)
	admin := filepath.Join(h.dropIn.ConfigDir, "10-admin.conf")
	os.WriteFile(admin, []byte("[crio.image]\npinned_images = [\"registry.example/admin*\"]\n"), 0o644)
	h.start()
	h.writeFile("one.yaml", setDoc("one", a))
	h.writeFile("two.yaml", v1Doc("two", "worker", b, c))
	h.waitFor("both Ready", func(n status.Node) bool { return phase("one", status.Ready)(n) && phase("two", status.Ready)(n) })
	pinned := h.rt.Pinned()
	for _, want := range []string{a, b, c, "registry.example/admin*"} {
		if !slices.Contains(pinned, want) {
			t.Fatalf("%s not pinned: %v", want, pinned)
		}
	}
	// An administrator's edit is followed.
	os.WriteFile(admin, []byte("[crio.image]\npinned_images = [\"registry.example/other*\"]\n"), 0o644)
	h.trigger()
	h.waitFor("admin edit followed", func(status.Node) bool {
		p := h.rt.Pinned()
		return slices.Contains(p, "registry.example/other*") && !slices.Contains(p, "registry.example/admin*")
	})
	// Removing a set unpins its images after unpin_delay, keeps them present, and leaves
	// the other set alone.
	os.Remove(filepath.Join(h.cfg.SetsDir, "two.yaml"))
	h.trigger()
	h.waitFor("two gone from status", func(n status.Node) bool { return n.Set("two") == nil && n.Set("one") != nil })
	if !slices.Contains(h.rt.Pinned(), b) {
		t.Fatal("unpinned before unpin_delay")
	}
	h.waitFor("unpinned after the delay", func(status.Node) bool { return !slices.Contains(h.rt.Pinned(), b) })
	if !h.rt.Present(b) || !h.rt.Present(c) {
		t.Fatal("imagepind must never delete images")
	}
	if !slices.Contains(h.rt.Pinned(), a) {
		t.Fatal("the other set was unpinned")
	}
}

func TestLabelsMoveSetsInAndOut(t *testing.T) {
	h := newHarness(t)
	a := img("a", 1)
	h.available(a)
	h.cfg.InlineLabels = nil
	h.start()
	h.writeFile("m.yaml", v1Doc("masters", "master", a))
	h.waitFor("status published", func(n status.Node) bool { return n.Node.Name != "" })
	if n := h.waitFor("no set", func(n status.Node) bool { return n.Set("masters") == nil }); len(n.FileErrors) != 0 {
		t.Fatalf("%+v", n.FileErrors)
	}
	os.WriteFile(h.cfg.LabelsFile, []byte(`{"node-role.kubernetes.io/master": ""}`), 0o644)
	h.trigger()
	h.waitFor("set in", phase("masters", status.Ready))
	os.WriteFile(h.cfg.LabelsFile, []byte(`{"node-role.kubernetes.io/worker": ""}`), 0o644)
	h.trigger()
	h.waitFor("set out", func(n status.Node) bool { return n.Set("masters") == nil })
	h.waitFor("unpinned", func(status.Node) bool { return !slices.Contains(h.rt.Pinned(), a) })

	// A broken labels file is a fault that keeps the last good labels.
	os.WriteFile(h.cfg.LabelsFile, []byte(`{"node-role.kubernetes.io/master": `), 0o644)
	h.trigger()
	n := h.waitFor("fault", func(n status.Node) bool { return len(n.Faults) > 0 })
	if !strings.Contains(n.Faults[0], "labels file") || n.Set("masters") != nil {
		t.Fatalf("%+v", n)
	}
}

func TestBadFilesLoseNothing(t *testing.T) {
	h := newHarness(t)
	a, b := img("a", 1), img("b", 2)
	h.available(a, b)
	h.start()
	h.writeFile("good.yaml", setDoc("good", a))
	h.writeFile("other.yaml", setDoc("other", b))
	h.waitFor("Ready", func(n status.Node) bool { return phase("good", status.Ready)(n) && phase("other", status.Ready)(n) })
	dropin, _ := os.ReadFile(h.dropIn.Path())

	// The file breaks (a tag, a syntax error): its last good content stays in force.
	h.writeFile("good.yaml", setDoc("good", "registry.example/a:latest"))
	h.writeFile("other.yaml", "apiVersion: [")
	h.writeFile("new.yaml", "kind: PinnedImageSet\n\tbad")
	n := h.waitFor("file errors", func(n status.Node) bool { return len(n.FileErrors) == 3 })
	for _, fe := range n.FileErrors {
		if !strings.HasPrefix(fe.Error, fe.File+": ") {
			t.Errorf("error does not name the file: %+v", fe)
		}
	}
	if !strings.Contains(n.FileErrors[0].Error, "is not by digest") || !strings.Contains(n.FileErrors[0].Error, "last good content") {
		t.Fatalf("%+v", n.FileErrors[0])
	}
	if n.Set("good") == nil || n.Set("good").Phase != status.Ready || n.Set("other") == nil {
		t.Fatalf("sets must stay: %+v", n.Sets)
	}
	time.Sleep(2 * h.cfg.UnpinDelay)
	if after, _ := os.ReadFile(h.dropIn.Path()); string(after) != string(dropin) {
		t.Fatalf("drop-in changed:\n%s\n---\n%s", dropin, after)
	}

	// A restart with the file still broken keeps the last good content too.
	h.stop()
	h.start()
	n = h.waitFor("restarted", func(n status.Node) bool { return phase("good", status.Ready)(n) && phase("other", status.Ready)(n) })
	if len(n.FileErrors) != 3 {
		t.Fatalf("%+v", n.FileErrors)
	}
	if h.rt.PullCount(a) != 1 {
		t.Fatalf("restart pulled a present image again: %d", h.rt.PullCount(a))
	}

	// The sets directory disappearing is a fault, not an unpin.
	os.Rename(h.cfg.SetsDir, h.cfg.SetsDir+".gone")
	h.trigger()
	n = h.waitFor("fault", func(n status.Node) bool { return len(n.Faults) > 0 })
	if !strings.Contains(n.Faults[0], "sets directory is missing") || n.Set("good") == nil {
		t.Fatalf("%+v", n)
	}
	time.Sleep(2 * h.cfg.UnpinDelay)
	if !slices.Contains(h.rt.Pinned(), a) || !slices.Contains(h.rt.Pinned(), b) {
		t.Fatal("unpinned on a sync fault")
	}
}

func TestPullFailuresAndRecovery(t *testing.T) {
	h := newHarness(t)
	good, missing, flaky := img("good", 1), img("missing", 2), img("flaky", 3)
	h.available(good)
	h.rt.Registry[flaky] = &cri.PullError{Message: "pinging container registry: 503 Service Unavailable"}
	h.start()
	h.writeFile("s.yaml", setDoc("s", good, missing, flaky))
	n := h.waitFor("retrying", func(n status.Node) bool {
		s := n.Set("s")
		return s != nil && s.Phase == status.Pulling && s.Condition(status.ConditionProgressing).Reason == status.ReasonPullRetrying
	})
	s := n.Set("s")
	if len(s.FailedImages) != 1 || s.FailedImages[0].Image != missing || s.FailedImages[0].Error != "reading manifest "+missing[strings.Index(missing, "@")+1:]+": manifest unknown" {
		t.Fatalf("failed images %+v", s.FailedImages)
	}
	if !h.rt.Present(good) || !slices.Contains(h.rt.Pinned(), good) {
		t.Fatal("the set's other images must still be pulled and pinned")
	}
	// The transient error clears: only the unavailable image remains → Failed.
	h.rt.SetRegistry(flaky, nil)
	h.waitFor("Failed ImageUnavailable", func(n status.Node) bool {
		s := n.Set("s")
		return s != nil && s.Phase == status.Failed && s.Condition(status.ConditionFailed).Reason == status.ReasonImageUnavailable
	})
	// The image appears in the registry: the set leaves Failed by itself.
	h.rt.SetRegistry(missing, nil)
	h.waitFor("Ready", phase("s", status.Ready))
}

func TestRuntimeOutageAndStorageWipe(t *testing.T) {
	h := newHarness(t)
	a := img("a", 1)
	h.available(a)
	h.rt.SetDown(true)
	h.cfg.RuntimeSocket = filepath.Join(h.root, "crio.sock")
	os.WriteFile(h.cfg.RuntimeSocket, nil, 0o600)
	h.start()
	h.writeFile("s.yaml", setDoc("s", a))
	n := h.waitFor("runtime unavailable", func(n status.Node) bool {
		s := n.Set("s")
		return s != nil && s.Condition(status.ConditionProgressing).Reason == status.ReasonRuntimeUnavailable
	})
	// The drop-in is written even while CRI-O is down (once the disk check, off the
	// loop, has admitted the set).
	h.waitFor("the drop-in written", func(status.Node) bool { _, err := os.Stat(h.dropIn.Path()); return err == nil })
	_ = n
	h.rt.SetDown(false)
	h.waitFor("Ready after the runtime returns", phase("s", status.Ready))

	// CRI-O restarts having wiped its storage: its socket is new, so the image is
	// checked and pulled again.
	h.rt.Remove(a)
	os.Remove(h.cfg.RuntimeSocket)
	os.WriteFile(h.cfg.RuntimeSocket+".new", nil, 0o600)
	os.Rename(h.cfg.RuntimeSocket+".new", h.cfg.RuntimeSocket)
	h.trigger()
	h.waitFor("Ready again", func(n status.Node) bool { return h.rt.PullCount(a) == 2 && phase("s", status.Ready)(n) })
}

func TestPullConcurrencyAndCredentials(t *testing.T) {
	h := newHarness(t)
	h.cfg.PullConcurrency = 3
	var images []string
	for i := 0; i < 12; i++ {
		images = append(images, img(fmt.Sprintf("r%d", i), i))
	}
	h.available(images...)
	h.rt.PullDelay = 20 * time.Millisecond
	secret := `{"auths": {"registry.example/r1": {"auth": "` + base64.StdEncoding.EncodeToString([]byte("puller:s3cret")) + `"}}}`
	os.WriteFile(h.cfg.PullSecret, []byte(secret), 0o600)
	h.start()
	h.writeFile("s.yaml", setDoc("s", images...))
	h.waitFor("Ready", phase("s", status.Ready))
	if h.rt.MaxParallel() != 3 {
		t.Fatalf("max concurrent pulls %d, want 3", h.rt.MaxParallel())
	}
	if h.rt.AuthUser(images[1]) != "puller" || h.rt.AuthUser(images[2]) != "" {
		t.Fatalf("auths %q %q", h.rt.AuthUser(images[1]), h.rt.AuthUser(images[2]))
	}
}

func TestPinsOverridden(t *testing.T) {
	h := newHarness(t)
	a := img("a", 1)
	h.available(a)
	os.WriteFile(filepath.Join(h.dropIn.ConfigDir, "zzz-late.conf"), []byte("[crio.image]\npinned_images = [\"registry.example/late*\"]\n"), 0o644)
	h.start()
	h.writeFile("s.yaml", setDoc("s", a))
	n := h.waitFor("overridden", phase("s", status.Failed))
	if c := n.Set("s").Condition(status.ConditionFailed); c.Reason != status.ReasonPinsOverridden || !strings.Contains(c.Message, "zzz-late.conf") {
		t.Fatalf("%+v", c)
	}
	os.Remove(filepath.Join(h.dropIn.ConfigDir, "zzz-late.conf"))
	h.trigger()
	h.waitFor("Ready", phase("s", status.Ready))
}

func TestRuntimeTooOld(t *testing.T) {
	h := newHarness(t)
	a := img("a", 1)
	h.available(a)
	h.rt.Ver = "1.29.1"
	h.start()
	h.writeFile("s.yaml", setDoc("s", a))
	n := h.waitFor("too old", phase("s", status.Failed))
	if c := n.Set("s").Condition(status.ConditionFailed); c.Reason != status.ReasonRuntimeTooOld || !strings.Contains(c.Message, "restart CRI-O") {
		t.Fatalf("%+v", c)
	}
	if h.rt.ReloadCount() != 0 {
		t.Fatal("reloading a CRI-O that does not apply pins on reload is pointless")
	}
	h.waitFor("pulled anyway", func(status.Node) bool { return h.rt.Present(a) })
}

// A reload that fails, and one CRI-O does not act on, leave the set waiting with the
// reason, pull nothing before the pins are in effect, and are retried until confirmed.
func TestReloadFailureIsRetried(t *testing.T) {
	for _, mode := range []string{"fails", "ignored"} {
		t.Run(mode, func(t *testing.T) {
			h := newHarness(t)
			h.cfg.ConfirmTimeout = 200 * time.Millisecond
			h.cfg.MaxBackoff = 300 * time.Millisecond
			a := img("a", 1)
			h.available(a)
			want := "reload: job failed"
			if mode == "fails" {
				h.rt.FailReloads(2)
			} else {
				h.rt.IgnoreReloads(2)
				want = "not in effect after"
			}
			h.start()
			h.writeFile("s.yaml", setDoc("s", a))
			n := h.waitFor("waiting for the reload", func(n status.Node) bool {
				s := n.Set("s")
				return s != nil && s.Phase == status.Pending && s.Condition(status.ConditionProgressing).Reason == status.ReasonWaitingForReload &&
					strings.Contains(s.Condition(status.ConditionProgressing).Message, want)
			})
			if !strings.Contains(strings.Join(n.Faults, "\n"), want) {
				t.Fatalf("faults %q lack %q", n.Faults, want)
			}
			if h.rt.PullCount(a) != 0 {
				t.Fatal("pulled before the pins were in effect")
			}
			h.waitFor("Ready after retries", phase("s", status.Ready))
			if got := h.rt.ReloadCount(); got < 3 {
				t.Fatalf("%d reloads, want the 2 bad ones retried", got)
			}
		})
	}
}

// ENOSPC from the runtime stops every remaining pull at once: InsufficientDiskSpace.
func TestNoSpaceStopsPulls(t *testing.T) {
	h := newHarness(t)
	h.cfg.PullConcurrency = 1
	h.cfg.MaxBackoff = 5 * time.Second
	var images []string
	for i := 0; i < 6; i++ {
		images = append(images, img(fmt.Sprintf("full%d", i), i))
	}
	h.available(images...)
	h.rt.Registry[images[1]] = &cri.PullError{Message: "writing blob: storing blob to file \"/var/tmp/x\": write /var/tmp/x: no space left on device"}
	h.start()
	h.writeFile("s.yaml", setDoc("s", images...))
	n := h.waitFor("Failed InsufficientDiskSpace", func(n status.Node) bool {
		s := n.Set("s")
		return s != nil && s.Phase == status.Failed && s.Condition(status.ConditionFailed).Reason == status.ReasonInsufficientDiskSpace
	})
	s := n.Set("s")
	if len(s.FailedImages) != 1 || s.FailedImages[0].Reason != status.ReasonInsufficientDiskSpace || !strings.Contains(s.FailedImages[0].Error, "no space left on device") {
		t.Fatalf("%+v", s.FailedImages)
	}
	time.Sleep(300 * time.Millisecond)
	pulled := 0
	for _, i := range images[2:] {
		pulled += h.rt.PullCount(i)
	}
	if pulled != 0 {
		t.Fatalf("%d pulls after ENOSPC; they must stop at once", pulled)
	}
}

type countingObserver struct {
	noObserver
	mu         sync.Mutex
	reconciles int
}

func (c *countingObserver) Reconciled(time.Time) {
	c.mu.Lock()
	c.reconciles++
	c.mu.Unlock()
}

func (c *countingObserver) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reconciles
}

// After a failure that has cleared (ENOSPC once, then the pull works), an idle loop
// must not spin on retry times already past.
func TestIdleAfterFailuresDoesNotSpin(t *testing.T) {
	h := newHarness(t)
	h.cfg.MaxBackoff = 50 * time.Millisecond
	good, full := img("good", 1), img("full", 2)
	h.available(good, full)
	h.rt.Registry[full] = &cri.PullError{Message: "no space left on device"}
	obs := &countingObserver{}
	h.observer = obs
	h.start()
	h.writeFile("s.yaml", setDoc("s", good, full))
	h.waitFor("failed", phase("s", status.Failed))
	h.rt.SetRegistry(full, nil)
	h.waitFor("Ready", phase("s", status.Ready))
	time.Sleep(200 * time.Millisecond)
	before := obs.count()
	time.Sleep(time.Second)
	if n := obs.count() - before; n > 2 {
		t.Fatalf("%d reconciles in an idle second: the loop spins", n)
	}
}

type fakeReleases struct {
	mu  sync.Mutex
	rel release.Release
	err error
}

func (f *fakeReleases) set(rel release.Release, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rel, f.err = rel, err
}

func (f *fakeReleases) Expand(context.Context, string) (release.Release, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rel, f.err
}

func TestReleaseSets(t *testing.T) {
	h := newHarness(t)
	relImg, comp, os9, os10 := img("ocp/release", 100), img("ocp/comp", 101), img("ocp/os9", 102), img("ocp/os10", 103)
	h.available(relImg, comp, os9, os10)
	rel := release.Release{Image: relImg, Version: "4.20.1", Components: map[string]string{"c": comp},
		Streams: map[string]map[string]string{"rhel-9": {"rhel-coreos": os9}, "rhel-10": {"rhel-coreos-10": os10}}, DefaultStream: "rhel-9"}
	fr := &fakeReleases{err: fmt.Errorf("pinging container registry: %w", errors.New("connection refused"))}
	h.releases = fr
	h.start()
	doc := "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: up}\nspec: {releaseImage: \"" + relImg + "\"}\n"
	h.writeFile("up.yaml", doc)
	// Unreachable at first: retried, not failed.
	n := h.waitFor("retrying", func(n status.Node) bool {
		s := n.Set("up")
		return s != nil && s.Phase == status.Pending && s.Release != nil && strings.Contains(s.Release.Error, "connection refused")
	})
	_ = n
	fr.set(rel, nil)
	n = h.waitFor("Ready", phase("up", status.Ready))
	if s := n.Set("up"); s.ImagesTotal != 2 || s.Release.Images != 2 || s.Release.Version != "4.20.1" || s.Release.Error != "" {
		t.Fatalf("worker: %+v %+v", s, s.Release)
	}
	if !slices.Contains(h.rt.Pinned(), comp) || !slices.Contains(h.rt.Pinned(), os9) || slices.Contains(h.rt.Pinned(), relImg) {
		t.Fatalf("pins %v", h.rt.Pinned())
	}
	// The registry goes away: the last good expansion stays pinned and Ready.
	fr.set(release.Release{}, errors.New("connection refused"))
	h.writeFile("up.yaml", doc+"# touched\n")
	time.Sleep(2 * h.cfg.UnpinDelay)
	if !slices.Contains(h.rt.Pinned(), comp) {
		t.Fatal("an unreachable release unpinned its images")
	}
	// Not a release: Failed, InvalidSpec.
	fr.set(release.Release{}, fmt.Errorf("%w: no image-references", release.ErrNotRelease))
	h.writeFile("up.yaml", strings.Replace(doc, relImg, img("ocp/other", 104), 1))
	n = h.waitFor("invalid", phase("up", status.Failed))
	if c := n.Set("up").Condition(status.ConditionFailed); c.Reason != status.ReasonInvalidSpec || !strings.Contains(c.Message, "no image-references") {
		t.Fatalf("%+v", c)
	}
}

// slowReloader makes every reload, and so the pass that does it, take a while.
type reloader interface {
	Reload(ctx context.Context) error
}

type slowReloader struct {
	inner reloader
	delay time.Duration
}

func (r slowReloader) Reload(ctx context.Context) error {
	time.Sleep(r.delay)
	return r.inner.Reload(ctx)
}

// A release that is already due when the pass that scheduled it ends is still handled,
// promptly, with no other event to wake the loop: unpin_delay = 0 (documented as valid),
// and a delay shorter than a slow pass. And the loop does not spin afterwards.
func TestDueReleaseIsHandledWithoutAnotherEvent(t *testing.T) {
	for _, c := range []struct {
		name        string
		delay       time.Duration
		reloadDelay time.Duration
	}{
		{"unpin_delay 0s", 0, 0},
		{"delay shorter than a pass", 50 * time.Millisecond, 300 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			h.cfg.UnpinDelay = c.delay
			if c.reloadDelay > 0 {
				h.reloader = slowReloader{inner: h.rt, delay: c.reloadDelay}
			}
			obs := &countingObserver{}
			h.observer = obs
			a, b := img("a", 1), img("b", 2)
			h.available(a, b)
			h.start()
			h.writeFile("keep.yaml", setDoc("keep", a))
			h.writeFile("go.yaml", setDoc("go", b))
			h.waitFor("both Ready", func(n status.Node) bool { return phase("keep", status.Ready)(n) && phase("go", status.Ready)(n) })
			os.Remove(filepath.Join(h.cfg.SetsDir, "go.yaml"))
			h.trigger() // the only event: nothing else will wake the loop
			h.waitFor("b unpinned", func(status.Node) bool { return !slices.Contains(h.rt.Pinned(), b) })
			if !slices.Contains(h.rt.Pinned(), a) || !h.rt.Present(b) {
				t.Fatal("the other set was unpinned, or an image deleted")
			}
			time.Sleep(c.reloadDelay + 200*time.Millisecond)
			before := obs.count()
			time.Sleep(time.Second)
			if n := obs.count() - before; n > 2 {
				t.Fatalf("%d reconciles in an idle second: the loop spins", n)
			}
		})
	}
}

// fakeDisk answers the disk check as told: admit every set, refuse every set that
// misses an image (as a real check past the GC threshold), or fail as a whole (the image
// filesystem or every registry not answering).
type fakeDisk struct {
	mu   sync.Mutex
	mode string // "admit", "refuse", "fail", "hang"
	// gate, when set, holds each check until it is closed (a check under way).
	gate chan struct{}
	// early, when set, is what each check offers to be pulled before its verdict
	// (diskcheck.Early), of the first set missing any of them, before the gate.
	early []string
	// asked counts the checks, and askedEarly those the agent let offer early pulls.
	asked, askedEarly int
}

func (d *fakeDisk) set(mode string) {
	d.mu.Lock()
	d.mode = mode
	d.mu.Unlock()
}

func (d *fakeDisk) Check(ctx context.Context, sets []diskcheck.SetRequest, early func(diskcheck.Early)) (diskcheck.Result, error) {
	d.mu.Lock()
	gate, offer := d.gate, d.early
	d.asked++
	if early != nil {
		d.askedEarly++
	}
	d.mu.Unlock()
	if early != nil && len(offer) > 0 {
		for _, s := range sets {
			var imgs []string
			for _, ref := range s.Missing {
				if slices.Contains(offer, ref) {
					imgs = append(imgs, ref)
				}
			}
			if len(imgs) > 0 {
				early(diskcheck.Early{Set: s.Name, Images: imgs})
				break
			}
		}
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return diskcheck.Result{}, ctx.Err()
		}
	}
	d.mu.Lock()
	mode := d.mode
	d.mu.Unlock()
	if mode == "hang" { // a registry that accepts connections and never answers
		<-ctx.Done()
		return diskcheck.Result{}, ctx.Err()
	}
	if mode == "fail" {
		return diskcheck.Result{}, errors.New("image filesystem: statfs: input/output error")
	}
	res := diskcheck.Result{Verdicts: map[string]diskcheck.Verdict{}}
	for _, s := range sets {
		v := diskcheck.Verdict{Admitted: true, Condition: status.Condition{Type: status.ConditionDiskChecked, Status: status.True, Reason: status.ReasonSpaceAvailable, Message: "fits"}}
		if mode == "refuse" {
			v = diskcheck.Verdict{Condition: status.Condition{Type: status.ConditionDiskChecked, Status: status.False, Reason: status.ReasonInsufficientDiskSpace,
				Message: fmt.Sprintf("node worker-0: %d images need 9 GiB; image GC starts at 85%%", len(s.Missing))}}
		}
		res.Verdicts[s.Name] = v
	}
	return res, nil
}

// Disk pressure past the GC threshold: the check refuses every set from now on. A Ready
// set keeps its pins well past unpin_delay (the kubelet's image GC would take them), and
// stays Ready; a new image in it is neither pulled nor pinned, and the set says why.
func TestDiskPressureKeepsPins(t *testing.T) {
	h := newHarness(t)
	h.clock = testingclock.NewFakeClock(time.Now())
	disk := &fakeDisk{mode: "admit"}
	h.disk = disk
	a, b, d := img("a", 1), img("b", 2), img("d", 4)
	h.available(a, b, d)
	h.start()
	h.writeFile("s.yaml", setDoc("s", a, b))
	h.waitFor("Ready", phase("s", status.Ready))

	// The disk passes the GC threshold; the set gains an image, so the check runs again.
	disk.set("refuse")
	h.writeFile("s.yaml", setDoc("s", a, b, d))
	n := h.waitFor("refused for d", phase("s", status.Failed))
	if c := n.Set("s").Condition(status.ConditionReady); c.Reason != status.ReasonInsufficientDiskSpace || !strings.Contains(c.Message, "the 2 images already present stay pinned") {
		t.Fatalf("%+v", c)
	}
	h.clock.Step(10 * h.cfg.UnpinDelay) // long past unpin_delay, and past every backoff
	h.pass()
	h.pass()
	if p := h.rt.Pinned(); !slices.Contains(p, a) || !slices.Contains(p, b) || slices.Contains(p, d) || h.rt.PullCount(d) != 0 {
		t.Fatalf("disk pressure: pinned %v, pulls of d %d", p, h.rt.PullCount(d))
	}

	// Refused again with every image present: Ready, and pinned however long it lasts.
	h.writeFile("s.yaml", setDoc("s", a, b))
	n = h.waitFor("Ready while refused", phase("s", status.Ready))
	if c := n.Set("s").Condition(status.ConditionDiskChecked); c.Status != status.False {
		t.Fatalf("the check should have refused the set: %+v", c)
	}
	h.clock.Step(10 * h.cfg.UnpinDelay)
	h.pass()
	h.pass()
	if p := h.rt.Pinned(); !slices.Contains(p, a) || !slices.Contains(p, b) {
		t.Fatalf("disk pressure unpinned a Ready set: %v", p)
	}

	disk.set("admit")
	h.writeFile("s.yaml", setDoc("s", a, b, d))
	h.clock.Step(time.Minute)
	h.waitFor("Ready once the disk has room", func(n status.Node) bool { return phase("s", status.Ready)(n) && slices.Contains(h.rt.Pinned(), d) })
}

// A restart with the state file corrupt, CRI-O not answering and a disk check that
// fails: the drop-in is rebuilt into the state instead of emptied, and the set's pins
// outlive unpin_delay; when CRI-O returns the set is Ready with nothing pulled again.
func TestRestartWithLostStateKeepsTheDropIn(t *testing.T) {
	h := newHarness(t)
	h.clock = testingclock.NewFakeClock(time.Now())
	disk := &fakeDisk{mode: "admit"}
	h.disk = disk
	a, b := img("a", 1), img("b", 2)
	h.available(a, b)
	h.start()
	h.writeFile("s.yaml", setDoc("s", a, b))
	h.waitFor("Ready", phase("s", status.Ready))
	h.stop()

	if err := os.WriteFile(filepath.Join(h.root, "state", "state.json"), []byte("{\"pins\": {tru"), 0o600); err != nil {
		t.Fatal(err)
	}
	h.rt.SetDown(true)
	disk.set("fail")
	h.start()
	h.waitFor("runtime unavailable", func(n status.Node) bool {
		s := n.Set("s")
		return s != nil && s.Condition(status.ConditionProgressing).Reason == status.ReasonRuntimeUnavailable
	})
	h.clock.Step(10 * h.cfg.UnpinDelay)
	h.pass()
	h.pass()
	data, err := os.ReadFile(h.dropIn.Path())
	if err != nil || !strings.Contains(string(data), a) || !strings.Contains(string(data), b) {
		t.Fatalf("the drop-in lost the set's pins: %v\n%s", err, data)
	}
	h.rt.SetDown(false)
	h.clock.Step(time.Minute) // the runtime's retry comes due
	h.waitFor("Ready", phase("s", status.Ready))
	if h.rt.PullCount(a) != 1 || h.rt.PullCount(b) != 1 {
		t.Fatalf("pulled again: %d %d", h.rt.PullCount(a), h.rt.PullCount(b))
	}
	// A pattern the drop-in held that no set wants goes after unpin_delay, as any other.
	h.writeFile("s.yaml", setDoc("s", a))
	h.waitFor("b no longer wanted", func(n status.Node) bool { s := n.Set("s"); return s != nil && s.ImagesTotal == 1 })
	h.pass()
	if !slices.Contains(h.rt.Pinned(), b) {
		t.Fatal("b unpinned before unpin_delay")
	}
	h.clock.Step(h.cfg.UnpinDelay)
	h.waitFor("b unpinned", func(status.Node) bool { return !slices.Contains(h.rt.Pinned(), b) })
}

// A pull's pinned flag read before a pin confirmation is not trusted: the image is asked
// about again (it wedged a set as "present but not pinned" for good).
func TestStalePinnedAnswerIsCheckedAgain(t *testing.T) {
	h := newHarness(t)
	a := New(h.cfg, Deps{Runtime: h.rt, Pinners: map[string]pin.Pinner{"cri-o": &crio.Pinner{DropIn: h.dropIn, Live: h.rt, Reloader: h.rt}}, Disk: diskcheck.AdmitAll{}, State: h.store})
	ref := img("a", 1)
	a.rt.support.PinnedField = true
	a.pulls.images[ref] = &imageState{wanted: true, inflight: true}
	a.pulls.inflight = 1
	a.pins.gen = 2 // pins confirmed while the pull was in flight
	a.handleResult(pullResult{image: ref, gen: 1, after: cri.Image{Present: true, Pinned: false}})
	if a.pulls.images[ref].checked {
		t.Fatal("a pinned flag from an older pin generation was trusted")
	}
	if a.pulls.recheck.next.IsZero() {
		t.Fatal("no wake-up scheduled to ask again")
	}
	// Same generation, but the confirmed patterns match and CRI-O says unpinned.
	a.pulls.images[ref] = &imageState{wanted: true, inflight: true}
	a.pulls.inflight = 1
	a.pins.confirmedValid, a.pins.effective = true, []string{ref}
	a.handleResult(pullResult{image: ref, gen: 2, after: cri.Image{Present: true, Pinned: false}})
	if a.pulls.images[ref].checked {
		t.Fatal("an unpinned answer for a confirmed pattern was trusted")
	}
	// A fresh answer is trusted.
	a.pulls.images[ref] = &imageState{wanted: true, inflight: true}
	a.pulls.inflight = 1
	a.handleResult(pullResult{image: ref, gen: 2, after: cri.Image{Present: true, Pinned: true}})
	if !a.pulls.images[ref].checked || !a.pulls.images[ref].pinned {
		t.Fatal("a fresh answer was not taken")
	}
}

// A disk check that never answers does not stall the loop: files are still read, status
// published, the watchdog fed, and the set that waits says what it waits for.
func TestHangingDiskCheckDoesNotStallTheLoop(t *testing.T) {
	h := newHarness(t)
	disk := &fakeDisk{mode: "admit"}
	h.disk = disk
	alive := make(chan struct{}, 100)
	h.alive = func() {
		select {
		case alive <- struct{}{}:
		default:
		}
	}
	a, b := img("a", 1), img("b", 2)
	h.available(a, b)
	h.start()
	h.writeFile("one.yaml", setDoc("one", a))
	h.waitFor("one Ready", phase("one", status.Ready))
	disk.set("hang")
	h.writeFile("two.yaml", setDoc("two", b))
	n := h.waitFor("two waiting for the disk check", func(n status.Node) bool {
		s := n.Set("two")
		return s != nil && s.Phase == status.Pending && strings.Contains(s.Condition(status.ConditionReady).Message, "sizing the missing images from their registries (running for")
	})
	if n.Set("one").Phase != status.Ready || !slices.Contains(h.rt.Pinned(), a) || h.rt.PullCount(b) != 0 {
		t.Fatalf("one %s, pinned %v, pulls of b %d", n.Set("one").Phase, h.rt.Pinned(), h.rt.PullCount(b))
	}
	for len(alive) > 0 {
		<-alive
	}
	h.writeFile("three.yaml", setDoc("three", a))
	h.waitFor("three Ready while the check hangs", phase("three", status.Ready))
	select {
	case <-alive:
	case <-time.After(5 * time.Second):
		t.Fatal("the loop stopped feeding the watchdog")
	}
}

// statusErrors fails ImageStatus for an image while told to, with an error that is not
// "the runtime is down".
type statusErrors struct {
	Runtime
	mu   sync.Mutex
	fail map[string]bool
}

func (s *statusErrors) set(ref string, fail bool) {
	s.mu.Lock()
	s.fail[ref] = fail
	s.mu.Unlock()
}

func (s *statusErrors) ImageStatus(ctx context.Context, ref string) (cri.Image, error) {
	s.mu.Lock()
	fail := s.fail[ref]
	s.mu.Unlock()
	if fail {
		return cri.Image{}, errors.New("rpc error: code = Internal desc = image status: layer lookup failed")
	}
	return s.Runtime.ImageStatus(ctx, ref)
}

// An ImageStatus error that is not "unavailable" schedules a wake-up: once it clears,
// the image is asked about again without any other event.
func TestImageStatusErrorSchedulesAWakeUp(t *testing.T) {
	h := newHarness(t)
	h.clock = testingclock.NewFakeClock(time.Now())
	a := img("a", 1)
	h.available(a)
	rt := &statusErrors{Runtime: h.rt, fail: map[string]bool{a: true}}
	h.runtime = rt
	h.start()
	h.writeFile("s.yaml", setDoc("s", a))
	h.pass()
	h.pass()
	if n := h.latestStatus(); phase("s", status.Ready)(n) || h.rt.PullCount(a) != 0 {
		t.Fatalf("nothing is known of the image yet: %+v, pulls %d", n.Sets, h.rt.PullCount(a))
	}
	rt.set(a, false)
	h.clock.Step(time.Minute) // no event: only the scheduled wake-up can bring the next pass
	h.waitFor("Ready", phase("s", status.Ready))
}

// widthObserver records the pull widths the agent used.
type widthObserver struct {
	countingObserver
	wmu    sync.Mutex
	widths []int
}

func (w *widthObserver) Width(n int) {
	w.wmu.Lock()
	w.widths = append(w.widths, n)
	w.wmu.Unlock()
}

func (w *widthObserver) seen() []int {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	return slices.Clone(w.widths)
}

// Pulls start at pull_concurrency at once (a set that fits in a round never waits for a
// ramp); transient registry errors halve the width, and the set still goes Ready.
func TestPullWidthStartsWideAndHalvesOnErrors(t *testing.T) {
	h := newHarness(t)
	h.cfg.PullConcurrency = 8
	obs := &widthObserver{}
	h.observer = obs
	h.rt.PullDelay = 20 * time.Millisecond
	var images []string
	for i := 0; i < 48; i++ {
		images = append(images, img(fmt.Sprintf("w%d", i), i))
	}
	h.available(images...)
	busy := &cri.PullError{Message: "reading manifest: received unexpected HTTP status: 503 Service Unavailable"}
	for _, ref := range images[8:12] {
		h.rt.SetRegistry(ref, busy)
	}
	h.start()
	h.writeFile("s.yaml", setDoc("s", images...))
	// Four errors: 8 → 4 → 2 → 1 (a narrower probe alone loses here, since the fake's
	// throughput grows with the width, and would never go below 4).
	h.waitFor("the width halved by each error", func(status.Node) bool { return slices.Contains(obs.seen(), 1) })
	if got := h.rt.MaxParallel(); got != 8 {
		t.Fatalf("at most %d pulls at once before the errors, want 8 from the start", got)
	}
	for _, ref := range images[8:12] {
		h.rt.SetRegistry(ref, nil)
	}
	h.waitFor("Ready", phase("s", status.Ready))
	if ws := obs.seen(); slices.Max(ws) > 8 {
		t.Fatalf("widths %v exceed pull_concurrency", ws)
	}
}

// Ready follows the last pull at once: the full pass put off while pull results stream
// in (passEvery) is not waited for once no pull is left in flight. The fake clock never
// moves here, so a pass put off by even a millisecond would never come.
func TestReadyFollowsTheLastPullAtOnce(t *testing.T) {
	h := newHarness(t)
	h.clock = testingclock.NewFakeClock(time.Now())
	imgs := []string{img("a", 1), img("b", 2), img("c", 3), img("d", 4), img("e", 5)}
	h.available(imgs...)
	h.start()
	h.writeFile("s.yaml", setDoc("s", imgs...))
	deadline := time.Now().Add(5 * time.Second)
	for !phase("s", status.Ready)(h.latestStatus()) {
		if time.Now().After(deadline) {
			n := h.latestStatus()
			t.Fatalf("no Ready without the clock moving: %+v", n.Set("s"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, ref := range imgs {
		if !h.rt.Present(ref) || !slices.Contains(h.rt.Pinned(), ref) {
			t.Fatalf("%s: present %v, pinned %v", ref, h.rt.Present(ref), h.rt.Pinned())
		}
	}
}

// A set that targets no node (neither spec.nodeSelector nor a role label) is in the
// node's status as such, not only in the log; a set that selects other nodes is not.
func TestStatusListsASetTargetingNoNode(t *testing.T) {
	h := newHarness(t)
	a := img("a", 1)
	h.available(a)
	h.start()
	h.writeFile("nowhere.yaml", "apiVersion: imagepin.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: nowhere}\nspec:\n  pinnedImages: [\""+a+"\"]\n")
	h.writeFile("masters.yaml", v1Doc("masters", "master", a))
	n := h.waitFor("the set targeting no node listed", func(n status.Node) bool { return len(n.Untargeted) > 0 })
	want := []status.Untargeted{{Name: "nowhere", File: "nowhere.yaml", Why: "no spec.nodeSelector and no machineconfiguration.openshift.io/role label"}}
	if !slices.Equal(n.Untargeted, want) || len(n.Sets) != 0 {
		t.Fatalf("untargeted %+v, sets %+v; want %+v and no set", n.Untargeted, n.Sets, want)
	}
}
