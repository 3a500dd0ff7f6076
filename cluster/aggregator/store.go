package aggregator

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
	"github.com/imagepin/imagepin/status"
)

// Limits bound what one report and the whole store may hold.
type Limits struct {
	MaxNodes            int
	MaxSetsPerReport    int
	MaxImagesPerSetList int // failed images kept per set
	MaxStringLength     int
}

// DefaultLimits fit a large cluster with headroom.
func DefaultLimits() Limits {
	return Limits{MaxNodes: 10000, MaxSetsPerReport: 1000, MaxImagesPerSetList: 2000, MaxStringLength: 16 << 10}
}

// DefaultHeartbeat is assumed for a report that does not say its own.
const DefaultHeartbeat = 30 * time.Second

// Errors Ingest returns; the gRPC layer maps them to codes.
var (
	ErrInvalid  = errors.New("invalid report")
	ErrTooMany  = errors.New("too many nodes")
	ErrIdentity = errors.New("report for another node")
)

// nodeEntry is a node's newest report and what the store learned around it.
type nodeEntry struct {
	name      string
	bootID    string
	sequence  uint64
	heartbeat time.Duration
	// received is when the report was really received, also for one restored from the
	// state file: a node silent for 20 h is Unknown after a restart too.
	received time.Time
	// restored marks a report restored from the state file and not yet followed by a live
	// one: it shows on the page, but a new leader's warm-up waits for a live report.
	restored bool
	status   status.Node
	// blobs are what the report says of the node's pinned images' blobs (nil: nothing;
	// a report restored from the state file never says).
	blobs *nodeBlobs
	// progress remembers, per set and spec hash, when progress was first seen, for ETAs.
	progress map[string]progressSample
}

type progressSample struct {
	specHash string
	at       time.Time
	bytes    uint64
	images   int
}

// Store keeps the newest report of every node. It is safe for concurrent use.
type Store struct {
	limits Limits
	now    func() time.Time

	mu       sync.RWMutex
	nodes    map[string]*nodeEntry
	expected map[string]bool
	// targets are the sets of the cluster's API and the nodes each selects (SetTargets).
	targets map[string]Target
	// dirty are the nodes whose report changed since the last takeDirty (persistence).
	dirty map[string]bool
	// peers index the nodes that share blobs ([peers]) by the sets they pin.
	peers peerIndex
	// tables are the nodes' tables of blobs by id, each kept once (blobs.go);
	// generation counts the changes of reports, for the count of holders (holders.go).
	tables     map[string]*blobTable
	generation uint64
	// holders is the last count of who holds which blob; started is when the store was
	// made (a count is not sure until nodes had time to report).
	holders holdCache
	started time.Time
}

// NewStore returns an empty store; now is the clock (time.Now in production).
func NewStore(limits Limits, now func() time.Time) *Store {
	return &Store{limits: limits, now: now, nodes: map[string]*nodeEntry{}, started: now(), holders: holdCache{every: HoldersFreshness}}
}

// SetExpected sets the nodes expected to report: those that never did count as Unknown.
func (s *Store) SetExpected(nodes []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expected = map[string]bool{}
	for _, n := range nodes {
		s.expected[n] = true
	}
}

// Ingest validates a report of node (the certificate's name) and keeps it when it is
// newer than what the store has. A rejected report changes nothing.
func (s *Store) Ingest(node string, r *v1.NodeReport) (bool, error) {
	return s.ingest(node, r, s.now(), false)
}

// restore puts a report from the state file back, with the time it was really received.
func (s *Store) restore(node string, r *v1.NodeReport, received time.Time) (bool, error) {
	return s.ingest(node, r, received, true)
}

// ingest keeps a report received at now; restored says it comes from the state file.
func (s *Store) ingest(node string, r *v1.NodeReport, now time.Time, restored bool) (bool, error) {
	if r.GetNode() != node {
		return false, fmt.Errorf("%w: certificate says %q, report says %q", ErrIdentity, node, r.GetNode())
	}
	if err := s.validate(r); err != nil {
		return false, err
	}
	parsed, err := s.parseBlobs(r.GetBlobs())
	if err != nil {
		return false, err
	}
	converted := r.ToStatus() // outside the lock: readers and other nodes wait less
	intern(&converted)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.nodes[node]
	if e == nil {
		if len(s.nodes) >= s.limits.MaxNodes {
			return false, fmt.Errorf("%w: the store holds %d nodes, at most %d", ErrTooMany, len(s.nodes), s.limits.MaxNodes)
		}
	} else if e.bootID == r.GetBootId() && r.GetSequence() <= e.sequence {
		return false, nil // an older (or repeated) report from the same boot
	}
	blobs, _, err := s.resolveBlobs(r.GetBlobs(), parsed)
	if err != nil {
		return false, err
	}
	if e == nil {
		e = &nodeEntry{name: node, progress: map[string]progressSample{}}
		s.nodes[node] = e
	}
	s.keepBlobs(e, blobs)
	s.generation++
	e.bootID, e.sequence, e.received, e.restored = r.GetBootId(), r.GetSequence(), now, restored
	e.heartbeat = time.Duration(r.GetHeartbeatMillis()) * time.Millisecond
	if e.heartbeat <= 0 {
		e.heartbeat = DefaultHeartbeat
	}
	oldSets := setNames(e)
	e.status = converted
	s.peers.update(node, peerAddress(e), oldSets, setNames(e))
	if s.dirty == nil {
		s.dirty = map[string]bool{}
	}
	s.dirty[node] = true
	// ETA samples: the first time a set version is seen not Ready.
	seen := map[string]bool{}
	for _, set := range e.status.Sets {
		seen[set.Name] = true
		p, ok := e.progress[set.Name]
		if set.Phase == status.Ready {
			delete(e.progress, set.Name)
			continue
		}
		if !ok || p.specHash != set.SpecHash {
			e.progress[set.Name] = progressSample{specHash: set.SpecHash, at: now, bytes: set.BytesReady, images: set.ImagesReady}
		}
	}
	for name := range e.progress {
		if !seen[name] {
			delete(e.progress, name)
		}
	}
	return true, nil
}

func (s *Store) validate(r *v1.NodeReport) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
	}
	if msgs := validation.IsDNS1123Subdomain(r.GetNode()); len(msgs) > 0 {
		return bad("node %q: %s", r.GetNode(), strings.Join(msgs, "; "))
	}
	if r.GetBootId() == "" || len(r.GetBootId()) > 64 {
		return bad("boot_id must be 1 to 64 characters")
	}
	if len(r.GetSets()) > s.limits.MaxSetsPerReport {
		return bad("%d sets, at most %d", len(r.GetSets()), s.limits.MaxSetsPerReport)
	}
	long := func(v string) bool { return len(v) > s.limits.MaxStringLength }
	names := map[string]bool{}
	for i, set := range r.GetSets() {
		if msgs := validation.IsDNS1123Subdomain(set.GetName()); len(msgs) > 0 {
			return bad("sets[%d].name %q: %s", i, set.GetName(), strings.Join(msgs, "; "))
		}
		if names[set.GetName()] {
			return bad("sets[%d].name %q repeated", i, set.GetName())
		}
		names[set.GetName()] = true
		switch status.Phase(set.GetPhase()) {
		case status.Pending, status.Pulling, status.Ready, status.Failed:
		default:
			return bad("sets[%d].phase %q", i, set.GetPhase())
		}
		if set.GetImagesReady() > set.GetImagesTotal() || set.GetBytesReady() > set.GetBytesTotal() {
			return bad("sets[%d]: more ready than total", i)
		}
		if len(set.GetFailedImages()) > s.limits.MaxImagesPerSetList || len(set.GetConditions()) > 16 {
			return bad("sets[%d]: too many failed images or conditions", i)
		}
		for _, c := range set.GetConditions() {
			if long(c.GetMessage()) || long(c.GetReason()) {
				return bad("sets[%d]: a condition longer than %d bytes", i, s.limits.MaxStringLength)
			}
		}
		for _, f := range set.GetFailedImages() {
			if long(f.GetError()) || long(f.GetImage()) {
				return bad("sets[%d]: a failed image longer than %d bytes", i, s.limits.MaxStringLength)
			}
		}
	}
	if len(r.GetFileErrors()) > 1000 || len(r.GetFaults()) > 100 {
		return bad("too many file errors or faults")
	}
	return nil
}

// stored is a node's report as persisted; a nil report means the node was forgotten.
type stored struct {
	report   *v1.NodeReport
	received time.Time
}

// takeDirty returns the reports of the nodes that changed (or were forgotten) since the
// last call.
func (s *Store) takeDirty() map[string]stored {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]stored, len(s.dirty))
	for node := range s.dirty {
		if e := s.nodes[node]; e != nil {
			out[node] = stored{report: v1.FromStatus(e.status, e.bootID, e.sequence, e.heartbeat), received: e.received}
		} else {
			out[node] = stored{}
		}
	}
	s.dirty = nil
	return out
}

// nodeNames lists the nodes the store knows and expects, sorted.
func (s *Store) nodeNames() []string {
	all := map[string]bool{}
	for n := range s.nodes {
		all[n] = true
	}
	for n := range s.expected {
		all[n] = true
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
