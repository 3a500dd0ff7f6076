package agent

import (
	"time"

	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/diskcheck"
	"github.com/imagepin/imagepin/pin"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/pullcreds"
	"github.com/imagepin/imagepin/pullwidth"
	"github.com/imagepin/imagepin/state"
	"github.com/imagepin/imagepin/status"
)

// The Agent's state is in parts, each written by the file of the same job: inputs.go
// reads inputs, runtime.go keeps runtimeConn, pins.go pinState, pulls.go and verify.go
// pullState, disk.go diskState, releases.go releaseParts, status.go output. Every part
// is touched only by the loop's goroutine (Agent.Run), which is what makes the agent
// correct without locks; other parts are read, never written, across files. podStart
// (podstart.go) is what the kubelet will do with the images at pod start.

// inputs is what the node was asked to do: the sets read from the sets directory (local
// files and cluster/), its labels, the pull secret, and the state directory's data.
type inputs struct {
	dirty       bool // a file changed: read them again on the next pass
	sets        []pinset.Set
	setsLoaded  bool
	fileErrors  []status.FileError
	inputFaults []string
	// waitingForSync: the cluster sync has not written its first lists (Deps.SourceSynced)
	waitingForSync bool
	labels         map[string]string
	secret         *pullcreds.SecretFile // the pull secret file, read at every load of the inputs
	keyring        *pullcreds.Keyring    // its last good credentials
	data           state.Data            // last good contents, sizes, completed sets
	dataDirty      bool
}

// runtimeConn is the container runtime as last seen: its version, what it supports, and
// its pinner once known.
type runtimeConn struct {
	runtime   cri.Version
	support   pin.Support
	pinner    pin.Pinner // the runtime's, once known
	pinnerErr error      // why there is none
	err       error
	retry     retry
	socketID  fileID
}

// pinState is what was asked of the runtime's pins and what it was confirmed to have.
type pinState struct {
	faults         []string
	confirmed      []string // the effective pins the runtime was confirmed to have
	confirmedValid bool
	overriders     []string // CRI-O drop-ins read after ours that set pinned_images
	effective      []string
	retry          retry
	effMatch       patternMatcher // effective, compiled
	confMatch      patternMatcher // confirmed, compiled
	// pinGen counts pin confirmations: a pull result's pinned flag is only as fresh as
	// the generation it was dispatched in.
	gen int
}

// pullState is every wanted image's state and the pulls in flight.
type pullState struct {
	width     *pullwidth.Controller // how many pulls at once, at most cfg.PullConcurrency
	lastWidth int                   // as last observed
	images    map[string]*imageState
	inflight  int
	// dispatchFrom is where the scan for images to pull resumes between full passes.
	dispatchFrom int
	// The order of pulls by layer (Config.OrderByLayers, layers.go): fetching names the
	// pull fetching each layer the runtime does not hold yet, which no other pull may
	// start; held counts, for each layer, the wanted images pulled here that hold it.
	fetching map[string]*layerPull
	held     map[string]int
	jobs     chan pullJob
	results  chan pullResult
	// noSpaceTry holds pulls back after one failed for want of space, until its backoff
	// passes; a pull that succeeds meanwhile ends it (there is room again).
	noSpaceTry retry
	recheck    retry // present but not yet reported pinned
	verifying  bool  // a presence verification is in flight
}

// diskState is the disk check: each set's verdict and the check in flight.
type diskState struct {
	verdicts     map[string]diskcheck.Verdict
	lastAdmitted []pinset.Set // the sets pulls may start for, as of the last full pass
	// early is what the check under way says may be pulled before its verdict
	// (diskcheck.Early; zero: nothing), and earlyImages its images.
	early       diskcheck.Early
	earlyImages map[string]bool
	err         error
	retry       retry
	running     bool                       // a check is in flight
	sized       map[string]map[string]bool // per set, the images its verdict counted
	started     time.Time
	lastReqs    []diskcheck.SetRequest
	imageFS     status.ImageFilesystem
}

// releaseParts is the expansion of release sets (spec.releaseImage) into images.
type releaseParts struct {
	releases  map[string]releaseState // by set name
	expanding map[string]bool         // expansions running
	retry     retry
}

// output is the status last published.
type output struct {
	last       status.Node
	published  bool
	onFirstRun func()
}
