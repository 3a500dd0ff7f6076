package agent

import (
	"context"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/utils/clock"

	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/diskcheck"
	"github.com/imagepin/imagepin/kubelet"
	"github.com/imagepin/imagepin/pin"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/pullcreds"
	"github.com/imagepin/imagepin/pullwidth"
	"github.com/imagepin/imagepin/release"
	"github.com/imagepin/imagepin/state"
	"github.com/imagepin/imagepin/status"
)

// Runtime is the part of CRI the agent needs (declared once, in cri).
type Runtime = cri.ImageService

// DiskChecker decides which sets fit on the node before anything is pulled
// (diskcheck.Checker), checking them in the order given (name order).
type DiskChecker interface {
	Check(ctx context.Context, sets []diskcheck.SetRequest, early func(diskcheck.Early)) (diskcheck.Result, error)
}

// Observer receives the events metrics count. Results: pulls "success", "transient",
// "unavailable", "no_space"; reloads "confirmed", "failed".
type Observer interface {
	Pull(result string, d time.Duration)
	Reload(result string)
	Reconciled(t time.Time)
	// Width is how many pulls may run at once, when it changes.
	Width(n int)
}

type noObserver struct{}

func (noObserver) Width(int)                  {}
func (noObserver) Pull(string, time.Duration) {}
func (noObserver) Reload(string)              {}
func (noObserver) Reconciled(time.Time)       {}

// Tags is the pre-load of the tags the sets pin (tags.Node): the agent says which tags
// are wanted and asks which are held and what to report.
type Tags interface {
	// Want takes the tags the desired sets pin, at every pass; it never blocks.
	Want([]pinset.Tag)
	// Arrived says a pinned image (repo@sha256:…) is on the node now (its pull ended):
	// a tag waiting for its digest is made at once. It never blocks.
	Arrived(image string)
	// Held says whether the runtime holds t.Name as t.Image (as another digest: false):
	// a set is RegistryIndependent only when it holds all of the set's tags.
	Held(t pinset.Tag) bool
	// Status is the pinned tags for the node's status, and the faults of their
	// pre-load.
	Status() (*status.Tags, []string)
}

// Releases expands spec.releaseImage.
type Releases interface {
	Expand(ctx context.Context, pullSpec string) (release.Release, error)
}

// Config is what the agent needs to know, resolved by the composition root from the daemon's configuration.
type Config struct {
	NodeName     string
	Architecture string
	Version      string
	SetsDir      string
	// ClusterSync says that the cluster sync manages the sets directory's cluster
	// subdirectory: its disappearance is a fault, not the deletion of every cluster set.
	ClusterSync  bool
	InlineLabels map[string]string
	LabelsFile   string
	PullSecret   string
	UnpinDelay   time.Duration
	// PullConcurrency is the most pulls at once; how many run is found as they go
	// (package pullwidth).
	PullConcurrency int
	// OrderByLayers: no pull starts while another one fetches a layer it needs that the
	// runtime does not hold yet; it starts when that pull ends (layers.go). For a
	// runtime that fetches a shared layer once for each pull needing it at the same time
	// (CRI-O, straight from the registry); the composition root decides.
	OrderByLayers bool
	// PinWhileChecking: the images of a set the disk check has not judged yet are
	// pinned while it runs (a pin of an image the node does not hold takes no room), so
	// that the runtime has them in effect when the verdict lets the pulls start; a
	// verdict that refuses the set takes those pins away at once (pins.go). Off when a
	// pin lets the node-local mirror fill its store for peers: there a pin takes disk,
	// and waits for the verdict. The composition root decides.
	PinWhileChecking bool
	// PullEarly: with PinWhileChecking, the images the disk check under way proves fit
	// whatever its verdict are pulled before it (diskcheck.Early, disk.go).
	PullEarly   bool
	PullTimeout time.Duration
	// RuntimeSocket is the CRI socket's path: a new socket (inode) means the runtime
	// restarted, and may have wiped its storage, so every image is checked again.
	RuntimeSocket string
	// ConfirmTimeout bounds the wait for CRI-O to show the new pins after a reload.
	ConfirmTimeout time.Duration
	// MaxBackoff caps every retry delay.
	MaxBackoff time.Duration
	// VerifyEvery is how often the presence of every image imagepind holds present is
	// verified with one ListImages (0: every 2 minutes, so that an idle imagepind still
	// settles between two and gives its memory back): an image removed behind its back
	// (crictl rmi, podman rmi on CRI-O's storage; CRI-O sends no event) goes back to
	// Pulling and is pulled again.
	VerifyEvery time.Duration
	// Heartbeat, when set, is how often the loop proves it is alive (Deps.Alive) even
	// when idle: systemd's watchdog is fed by the loop itself, never by CRI-O's health.
	Heartbeat time.Duration
}

// Deps are the agent's collaborators.
type Deps struct {
	Runtime Runtime
	// Pinners are the runtime-specific parts, by the runtime's CRI name ("cri-o",
	// "containerd"). With one, it is used from the start (the config named the runtime);
	// with several, the runtime's CRI Version picks.
	Pinners map[string]pin.Pinner
	Disk    DiskChecker
	State   *state.Store
	// Secret is the pull secret file, shared with the daemon's registry access so it is
	// read in one place (nil: one of the agent's own for Config.PullSecret).
	Secret *pullcreds.SecretFile
	// Publish receives every status change (status file, sd_notify, reports).
	Publish func(status.Node)
	// Clock drives every time the agent schedules (retries, unpins, the wake-up timer,
	// the heartbeat); tests step a fake one instead of sleeping.
	Clock clock.WithTicker
	Log   logrus.FieldLogger
	// Releases expands release images; nil: sets with spec.releaseImage fail.
	Releases Releases
	// Observer counts pulls and reloads (metrics); nil counts nothing.
	Observer Observer
	// Alive is called after every pass of the loop and every Heartbeat.
	Alive func()
	// Idle is called after a pass that leaves nothing in flight and nothing due within a
	// minute (imagepind gives memory back to the system then); nil: nothing.
	Idle func()
	// Kubelet reads the kubelet's image pull credential verification (its config,
	// drop-ins and pull records); nil: not known, RegistryIndependent stays Unknown.
	Kubelet func() (kubelet.Verification, error)
	// RegistryBytes are the bytes this node fetched from registries for a pinned image
	// (for itself or for peers, [peers]); nil: not counted.
	RegistryBytes func(ref string) int64
	// SourceFaults are the problems of whatever fills the sets directory and the labels
	// file (the cluster sync: the API unreachable, no such Node); nil: none.
	SourceFaults func() []string
	// SourceSynced says whether whatever fills the sets directory has written its first
	// lists (the cluster sync: the sets and this Node's labels); until then the node's
	// status says WaitingForClusterSync. nil: always (local files only).
	SourceSynced func() bool
	// Tags pre-loads the tags the desired sets pin and says which are held; nil: tags
	// are not pre-loaded, none is held, the status shows none.
	Tags Tags
	// Seeds are the node's seeds for its status, given the references the desired sets
	// pin (seed.Report.Status): their totals, and their faults (a record that cannot be
	// read, a medium of the seed directory refused or unreadable, a pinned name seeded
	// with another digest). Part of the status, so a seed, or a seed removed, is a change
	// of it; the caller triggers a pass when the seeds change. nil: none.
	Seeds func(pinned []string) (*status.Seeded, []string)
	// Blobs says which blobs of each pinned image the node holds for its peers, for the
	// aggregator's count of holders (status.Node.Blobs); nil: none ([peers] off). Whoever
	// fills the store wakes the loop when that changes.
	Blobs BlobHoldings
	// Holders is the aggregator's count of the holders of every blob of a set's images:
	// a set is RegistryIndependent only when each has status.MinBlobHolders. nil: no
	// aggregator, and RegistryIndependent is never True.
	Holders HolderCounts
}

// Agent is the reconcile loop; New builds it, Run runs it.
type Agent struct {
	cfg   Config
	deps  Deps
	log   logrus.FieldLogger
	rand  *rand.Rand
	sched *schedule

	// passStart is when the last pass began: it has seen every time up to then.
	passStart time.Time
	// passCost is how long the last full pass took (wall time).
	passCost time.Duration

	// The loop's state, in the parts that own it (parts.go). Only the loop's goroutine reads or
	// writes any of them; work off the loop hands results back through done.
	in    inputs
	rt    runtimeConn
	pins  pinState
	pulls pullState
	disk  diskState
	rel   releaseParts
	out   output
	kube  podStart

	// Work off the loop (disk checks, release expansion) hands its result back as a
	// func the loop runs; bgCtx ends it when Run returns.
	done  chan func()
	bgCtx context.Context
	bg    sync.WaitGroup
	// runtimeEvents wakes the loop when a pinner's watch saw a change.
	runtimeEvents chan struct{}
	// lookNow wakes the loop for LookNow; lookAgain holds the looks it found under way.
	lookNow chan struct{}
	// sourcesChanged wakes the loop for SourcesChanged.
	sourcesChanged chan struct{}
	lookAgain      lookAgain
}

// New builds an agent. Nothing starts until Run.
func New(cfg Config, deps Deps) *Agent {
	if deps.Clock == nil {
		deps.Clock = clock.RealClock{}
	}
	if deps.Log == nil {
		deps.Log = logrus.StandardLogger()
	}
	if deps.Observer == nil {
		deps.Observer = noObserver{}
	}
	if deps.Alive == nil {
		deps.Alive = func() {}
	}
	if deps.Publish == nil {
		deps.Publish = func(status.Node) {}
	}
	if deps.Secret == nil {
		deps.Secret = &pullcreds.SecretFile{Path: cfg.PullSecret}
	}
	if cfg.PullConcurrency <= 0 {
		cfg.PullConcurrency = pullwidth.DefaultWidest
	}
	if cfg.ConfirmTimeout <= 0 {
		cfg.ConfirmTimeout = 30 * time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Minute
	}
	if cfg.VerifyEvery <= 0 {
		cfg.VerifyEvery = 2 * time.Minute
	}
	if cfg.PullTimeout <= 0 {
		cfg.PullTimeout = 30 * time.Minute
	}
	sched := newSchedule()
	var pinner pin.Pinner
	if len(deps.Pinners) == 1 {
		for _, p := range deps.Pinners {
			pinner = p
		}
	}
	return &Agent{
		cfg:   cfg,
		deps:  deps,
		log:   deps.Log,
		rand:  rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid()))),
		sched: sched,
		in:    inputs{dirty: true, secret: deps.Secret, keyring: &pullcreds.Keyring{}},
		rt:    runtimeConn{pinner: pinner, retry: retry{key: "runtime", sched: sched}},
		pins:  pinState{retry: retry{key: "pins", sched: sched}},
		pulls: pullState{
			width:      pullwidth.New(cfg.PullConcurrency),
			images:     map[string]*imageState{},
			jobs:       make(chan pullJob, cfg.PullConcurrency),
			results:    make(chan pullResult, cfg.PullConcurrency),
			noSpaceTry: retry{key: "no-space", sched: sched},
			recheck:    retry{key: "recheck", sched: sched},
		},
		disk:           diskState{retry: retry{key: "disk", sched: sched}},
		rel:            releaseParts{retry: retry{key: "releases", sched: sched}},
		done:           make(chan func(), 4),
		runtimeEvents:  make(chan struct{}, 1),
		lookNow:        make(chan struct{}, 1),
		sourcesChanged: make(chan struct{}, 1),
		bgCtx:          context.Background(),
	}
}

// OnFirstReconcile registers f to run once, after the first reconcile (READY=1).
func (a *Agent) OnFirstReconcile(f func()) { a.out.onFirstRun = f }

// Run reconciles until ctx ends: once at start, on every trigger (a file changed), when
// a pull finishes, and when a retry or an unpin delay is due.
func (a *Agent) Run(ctx context.Context, triggers <-chan struct{}) error {
	if err := a.loadState(); err != nil {
		a.log.WithError(err).Warn("state")
	}
	a.adoptHeld()
	var wg sync.WaitGroup
	workerCtx, stopWorkers := context.WithCancel(ctx)
	a.bgCtx = workerCtx
	for i := 0; i < a.cfg.PullConcurrency; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.pullWorker(workerCtx)
		}()
	}
	for _, p := range a.pinners() {
		if w, ok := p.(pin.Watcher); ok {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.Watch(workerCtx, func() {
					select {
					case a.runtimeEvents <- struct{}{}:
					default:
					}
				})
			}()
		}
	}
	defer func() {
		stopWorkers()
		wg.Wait()
		a.bg.Wait()
	}()

	timer := a.deps.Clock.NewTimer(time.Hour)
	defer timer.Stop()
	var heartbeat <-chan time.Time
	if a.cfg.Heartbeat > 0 {
		t := a.deps.Clock.NewTicker(a.cfg.Heartbeat)
		defer t.Stop()
		heartbeat = t.C()
	}
	full := true
	for {
		if !full {
			a.dispatchOnly()
			// The pulls drained (the last one landed, or what is left waits for a retry):
			// no result is streaming in that the pass was put off for, and status should
			// say Ready now, not up to passEvery later.
			full = a.pulls.inflight == 0
		}
		if full {
			a.Reconcile(ctx)
			a.sched.clear(passKey)
		}
		a.deps.Alive()
		if a.out.onFirstRun != nil {
			a.out.onFirstRun()
			a.out.onFirstRun = nil
		}
		wait := time.Hour
		if at, ok := a.nextWake(); ok {
			wait = max(at.Sub(a.deps.Clock.Now()), 10*time.Millisecond)
		}
		if a.deps.Idle != nil && wait >= time.Minute && a.pulls.inflight == 0 && !a.disk.running && len(a.rel.expanding) == 0 {
			a.deps.Idle()
		}
		timer.Reset(wait)
		quick := false // only pull results (or runtime events during pulls) came: dispatch now, the full pass when due
	idle:
		select {
		case <-ctx.Done():
			return nil
		case <-heartbeat:
			a.deps.Alive()
			goto idle
		case <-triggers:
			a.in.dirty = true
		case <-a.runtimeEvents:
			// While pulls stream in, the runtime reports every image they create
			// (containerd: a record without the pin label, which the pull's worker labels
			// as it returns): the pass that looks at them comes with the next one due, as
			// for pull results, not one per image. The pinner keeps what changed until then.
			quick = a.pulls.inflight > 0 && a.putPassOff()
		case <-a.lookNow:
			a.lookedNow()
		case <-a.sourcesChanged:
			a.retryFailedPulls()
		case f := <-a.done:
			f()
			for more := true; more; {
				select {
				case f := <-a.done:
					f()
				default:
					more = false
				}
			}
		case r := <-a.pulls.results:
			a.handleResult(r)
			// Take every result that is already there before reconciling again.
			for more := true; more; {
				select {
				case r := <-a.pulls.results:
					a.handleResult(r)
				default:
					more = false
				}
			}
			// While pulls stream in, free workers get the next images at once, and the
			// full pass (status, pins, presence: O(images)) runs at most every
			// passEvery: a pass per result made a 2000-image set cost O(images²).
			quick = a.putPassOff()
		case <-timer.C():
		}
		full = !quick
		if !timer.Stop() {
			select {
			case <-timer.C():
			default:
			}
		}
	}
}

// Reconcile runs every step once. Each step records its own errors in the agent's state
// for status; none stops the others.
func (a *Agent) Reconcile(ctx context.Context) {
	a.passStart = a.deps.Clock.Now()
	began := time.Now()
	defer func() { a.passCost = time.Since(began) }()
	if a.in.dirty {
		a.in.dirty = false
		a.loadInputs()
		// A changed file may be the kubelet's config: look at it again now.
		a.sched.clear(podStartKey)
	}
	desired := a.expandReleases(a.in.desiredSets())
	a.ensureRuntime(ctx)
	a.verifyPresence()
	a.checkPodStart()
	a.refreshPresence(ctx, desired)
	admitted := a.checkDisk(desired)
	a.syncPins(ctx, desired, admitted)
	// A confirmed pin change may have changed present images' pinned flags, and the
	// runtime may have said an image is gone: a missing image needs the disk check.
	a.refreshPresence(ctx, desired)
	admitted = a.checkDisk(desired)
	a.disk.lastAdmitted = a.disk.pullable(desired, admitted)
	a.pulls.dispatchFrom = 0 // a full pass looks at every image
	if a.pinsInEffect() {
		a.dispatchPulls(a.disk.lastAdmitted)
	}
	a.publish(desired)
	a.saveState()
	a.deps.Observer.Reconciled(a.deps.Clock.Now())
}

// fullPassEvery bounds how often pull results alone bring a full pass, and passShare
// the share of the loop's time full passes may take while pulls stream in (1 in 50): a
// pass is O(images), so with a large set the interval grows with it (a pass of 2 ms
// comes every 200 ms, one of 10 ms every 500 ms) and imagepind's cost per image stays
// flat.
const (
	fullPassEvery = 200 * time.Millisecond
	passShare     = 50
)

// passEvery is the least time between full passes while pull results stream in; at most
// maxPassEvery, so that status follows within seconds even after a pass that waited
// (a reload confirmed slowly).
func (a *Agent) passEvery() time.Duration {
	return min(max(fullPassEvery, passShare*a.passCost), maxPassEvery)
}

const maxPassEvery = 2 * time.Second

// passKey is the schedule's entry for a full pass put off while pull results stream in.
const passKey = "pass"

// putPassOff schedules the next full pass passEvery after the last one began and says
// so, unless it is due already (then it runs now).
func (a *Agent) putPassOff() bool {
	next := a.passStart.Add(a.passEvery())
	if !a.deps.Clock.Now().Before(next) {
		return false
	}
	a.sched.set(passKey, next)
	return true
}

// dispatchOnly hands free workers the next images of the sets admitted at the last full
// pass, between full passes.
func (a *Agent) dispatchOnly() {
	if a.pinsInEffect() {
		a.dispatchPulls(a.disk.lastAdmitted)
	}
}

// background runs work off the loop with a deadline; the func it returns runs on the
// loop afterwards. Nothing slow (registries) runs on the loop, which feeds the watchdog.
func (a *Agent) background(timeout time.Duration, work func(ctx context.Context) func()) {
	a.bg.Add(1)
	go func() {
		defer a.bg.Done()
		ctx, cancel := context.WithTimeout(a.bgCtx, timeout)
		apply := work(ctx)
		cancel()
		select {
		case a.done <- apply:
		case <-a.bgCtx.Done():
		}
	}()
}

// nextWake is the earliest time something on the schedule comes due that no pass has
// seen yet. A pass has seen every time up to its own start, so only later times count:
// one already due when the pass that scheduled it ends (unpin_delay = 0, or shorter than
// the pass) wakes the loop at once, and a time the pass handled, or that waits for an
// event (a free pull worker, an expired backoff whose failure has cleared), never does,
// so the loop cannot spin.
func (a *Agent) nextWake() (time.Time, bool) { return a.sched.next(a.passStart) }
