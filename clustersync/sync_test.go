package clustersync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/metadata"
	metafake "k8s.io/client-go/metadata/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/imagepin/imagepin/api/v1alpha1"
	"github.com/imagepin/imagepin/pinset"
)

const digest = "@sha256:1111111111111111111111111111111111111111111111111111111111111111"

func setObject(name string, images ...string) *unstructured.Unstructured {
	var list []any
	for _, i := range images {
		list = append(list, map[string]any{"name": i})
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.APIVersion, "kind": v1alpha1.Kind,
		"metadata": map[string]any{"name": name, "uid": "uid-" + name, "resourceVersion": "1"},
		"spec":     map[string]any{"nodeSelector": map[string]any{}, "pinnedImages": list},
		"status":   map[string]any{"nodes": "0/1"},
	}}
	return u
}

type world struct {
	dyn    *dynfake.FakeDynamicClient
	meta   *metafake.FakeMetadataClient
	syncer *Syncer
	dir    string
	labels string
	faults atomic.Int32
}

func newWorld(t *testing.T, objs ...runtime.Object) *world {
	t.Helper()
	scheme := runtime.NewScheme()
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(scheme,
		map[schema.GroupVersionResource]string{v1alpha1.GroupVersionResource: "PinnedImageSetList"}, objs...)
	mscheme := metafake.NewTestScheme()
	if err := metav1.AddMetaToScheme(mscheme); err != nil {
		t.Fatal(err)
	}
	node := &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: "worker-1", Labels: map[string]string{"topology.kubernetes.io/zone": "a"}},
	}
	meta := metafake.NewSimpleMetadataClient(mscheme, node)
	w := &world{dyn: dyn, meta: meta, dir: t.TempDir()}
	w.labels = filepath.Join(t.TempDir(), "node-labels.json")
	log := logrus.New()
	log.SetOutput(os.Stderr)
	w.syncer = New(dyn, meta, Config{NodeName: "worker-1", SetsDir: w.dir, LabelsFile: w.labels, Log: log,
		Debounce: 10 * time.Millisecond, OnFaults: func() { w.faults.Add(1) }})
	return w
}

func (w *world) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.syncer.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSetsAndLabelsFollowTheAPI(t *testing.T) {
	w := newWorld(t, setObject("a", "quay.io/x/a"+digest), setObject("b", "quay.io/x/b"+digest))
	local := filepath.Join(w.dir, "local.yaml")
	if err := os.WriteFile(local, []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	w.run(t)
	fileA := filepath.Join(w.syncer.Dir(), "a.json")
	eventually(t, "both sets written", func() bool {
		_, errA := os.Stat(fileA)
		_, errB := os.Stat(filepath.Join(w.syncer.Dir(), "b.json"))
		return errA == nil && errB == nil
	})
	// One document works as an object and as a file: the written file parses, status is left out.
	data, _ := os.ReadFile(fileA)
	res, err := pinset.ParseSetFile("cluster/a.json", data)
	if err != nil || len(res.Sets) != 1 || res.Sets[0].UID != "uid-a" || !res.Sets[0].Selector.Matches(nil) {
		t.Fatalf("written file does not parse as the object: %v %+v", err, res)
	}
	if strings.Contains(string(data), "status") || strings.Contains(string(data), "resourceVersion") {
		t.Fatalf("the file carries server-side fields:\n%s", data)
	}
	eventually(t, "labels written", func() bool {
		b, err := os.ReadFile(w.labels)
		var l map[string]string
		return err == nil && json.Unmarshal(b, &l) == nil && l["topology.kubernetes.io/zone"] == "a"
	})

	// Update, delete: the directory follows; the local file is never touched.
	res2 := w.dyn.Resource(v1alpha1.GroupVersionResource)
	ctx := context.Background()
	if _, err := res2.Update(ctx, setObject("a", "quay.io/x/a"+digest, "quay.io/x/c"+digest), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "update written", func() bool {
		b, _ := os.ReadFile(fileA)
		return strings.Contains(string(b), "quay.io/x/c")
	})
	if err := res2.Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "deleted set's file removed", func() bool {
		_, err := os.Stat(filepath.Join(w.syncer.Dir(), "b.json"))
		return errors.Is(err, os.ErrNotExist)
	})
	if b, err := os.ReadFile(local); err != nil || string(b) != "kept" {
		t.Fatalf("local file changed: %q %v", b, err)
	}
	if f := w.syncer.Faults(); len(f) != 0 {
		t.Fatalf("faults: %v", f)
	}
}

// The API failing is a fault that keeps every file; when it answers again, the fault clears.
func TestAPIDownKeepsFilesAndReportsFault(t *testing.T) {
	w := newWorld(t, setObject("a", "quay.io/x/a"+digest))
	var failing atomic.Bool
	var mu sync.Mutex
	var current *watch.FakeWatcher
	w.dyn.PrependReactor("list", "pinnedimagesets", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failing.Load() {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	// Behind a load balancer a gone API server is an EOF, which client-go turns into an
	// empty, successful watch: that must count as the API being down, not back.
	w.dyn.PrependWatchReactor("pinnedimagesets", func(k8stesting.Action) (bool, watch.Interface, error) {
		if failing.Load() {
			return true, watch.NewEmptyWatch(), nil
		}
		mu.Lock()
		defer mu.Unlock()
		current = watch.NewFake()
		return true, current, nil
	})
	w.run(t)
	file := filepath.Join(w.syncer.Dir(), "a.json")
	eventually(t, "synced", func() bool { _, err := os.Stat(file); return err == nil })
	eventually(t, "the watch healthy", func() bool { return len(w.syncer.Faults()) == 0 && w.faults.Load() == 0 })

	// The API goes: the open watch breaks, the reflector re-watches from its resourceVersion.
	failing.Store(true)
	mu.Lock()
	current.Stop()
	mu.Unlock()
	eventually(t, "fault reported", func() bool {
		f := w.syncer.Faults()
		return len(f) == 1 && strings.Contains(f[0], "nothing is unpinned")
	})
	time.Sleep(healthyAfter + time.Second)
	if f := w.syncer.Faults(); len(f) != 1 {
		t.Fatalf("the fault went while the API was down: %v", f)
	}
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("a synced file went while the API was down: %v", err)
	}
	failing.Store(false)
	eventually(t, "in step after the API is back", func() bool { return len(w.syncer.Faults()) == 0 })
	if _, err := os.Stat(file); err != nil {
		t.Fatal(err)
	}
}

// A first list that fails leaves the directory alone.
func TestAPIDownAtStartKeepsFiles(t *testing.T) {
	w := newWorld(t, setObject("a", "quay.io/x/a"+digest))
	var failing atomic.Bool
	failing.Store(true)
	w.dyn.PrependReactor("list", "pinnedimagesets", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failing.Load() {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	if err := os.MkdirAll(w.syncer.Dir(), 0o755); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(w.syncer.Dir(), "old.json")
	if err := os.WriteFile(old, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	w.run(t)
	eventually(t, "fault reported", func() bool {
		f := w.syncer.Faults()
		return len(f) == 1 && strings.Contains(f[0], "connection refused")
	})
	time.Sleep(300 * time.Millisecond)
	if _, err := os.Stat(old); err != nil {
		t.Fatalf("a synced file went while the API was down: %v", err)
	}
	failing.Store(false)
	eventually(t, "in step after the API is back", func() bool {
		_, errOld := os.Stat(old)
		_, errA := os.Stat(filepath.Join(w.syncer.Dir(), "a.json"))
		return errors.Is(errOld, os.ErrNotExist) && errA == nil && len(w.syncer.Faults()) == 0
	})
}

// A missing sets directory is not re-created (the agent must keep seeing that fault).
func TestMissingSetsDirIsAFault(t *testing.T) {
	w := newWorld(t, setObject("a", "quay.io/x/a"+digest))
	w.syncer.cfg.SetsDir = filepath.Join(w.dir, "gone")
	w.run(t)
	eventually(t, "fault", func() bool {
		f := w.syncer.Faults()
		return len(f) == 1 && strings.Contains(f[0], "is missing")
	})
	if _, err := os.Stat(filepath.Join(w.dir, "gone")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("sets dir created: %v", err)
	}
	// The directory back (no API event meanwhile): the sets follow and the fault clears.
	if err := os.Mkdir(filepath.Join(w.dir, "gone"), 0o755); err != nil {
		t.Fatal(err)
	}
	eventually(t, "in step once the directory is back", func() bool {
		_, err := os.Stat(filepath.Join(w.dir, "gone", "cluster", "a.json"))
		return err == nil && len(w.syncer.Faults()) == 0
	})
}

func TestUnknownNodeIsAFault(t *testing.T) {
	w := newWorld(t)
	w.syncer.cfg.NodeName = "worker-2"
	if err := os.WriteFile(w.labels, []byte(`{"a":"b"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	w.run(t)
	eventually(t, "fault", func() bool {
		f := w.syncer.Faults()
		return len(f) == 1 && strings.Contains(f[0], `no Node named "worker-2"`)
	})
	if b, _ := os.ReadFile(w.labels); string(b) != `{"a":"b"}` {
		t.Fatalf("labels file changed: %s", b)
	}
}

// A set name of 235 to 253 characters is a valid object name; its file and the temp file
// written before it must both fit NAME_MAX (255). Before the fix the temp name did not,
// and the sync retried every 200 ms forever.
func TestLongSetNamesReachTheNode(t *testing.T) {
	var objs []runtime.Object
	var names []string
	for _, n := range []int{234, 235, 250, 251, 253} {
		name := strings.Repeat("a", n-2) + "-b"
		names = append(names, name)
		o := setObject(name, "quay.io/x/a"+digest)
		o.SetUID(types.UID(fmt.Sprintf("550a1d88-2976-4447-9fc7-b65e457a7%03d", n)))
		objs = append(objs, o)
	}
	w := newWorld(t, objs...)
	w.run(t)
	eventually(t, "every long-named set written", func() bool {
		for _, name := range names {
			if _, err := os.Stat(filepath.Join(w.dir, pinset.ClusterFile(name))); err != nil {
				return false
			}
		}
		return true
	})
	files, err := pinset.ReadSetsDir(w.dir, true)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range files {
		res, err := pinset.ParseSetFile(f.Name, f.Data)
		if err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		for _, s := range res.Sets {
			got[s.Name] = true
		}
	}
	for _, name := range names {
		if !got[name] {
			t.Errorf("set of %d characters not read back by its full name", len(name))
		}
	}
	if f := w.syncer.Faults(); len(f) != 0 {
		t.Fatalf("faults: %v", f)
	}
}

// The sync keeps what it owns true: a file of the cluster subdirectory, the whole
// subdirectory or the labels file removed or changed behind its back is written again
// from the API with no API event. Before the fix nothing restored them until the next
// event, and the agent unpinned the cluster sets after unpin_delay.
func TestRemovedFilesAreRestoredWithoutAnAPIEvent(t *testing.T) {
	w := newWorld(t, setObject("a", "quay.io/x/a"+digest), setObject("b", "quay.io/x/b"+digest))
	w.run(t)
	fileA := filepath.Join(w.syncer.Dir(), "a.json")
	fileB := filepath.Join(w.syncer.Dir(), "b.json")
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	eventually(t, "synced", func() bool { return exists(fileA) && exists(fileB) && exists(w.labels) })
	want, _ := os.ReadFile(fileA)

	if err := os.Remove(fileA); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a file restored", func() bool { return exists(fileA) })

	if err := os.WriteFile(fileB, []byte(`{"tampered": true}`), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a changed file rewritten", func() bool {
		b, _ := os.ReadFile(fileB)
		return !strings.Contains(string(b), "tampered") && len(b) > 0
	})

	// The syncer may restore a file while the directory is being removed (RemoveAll then
	// finds it not empty): remove until one removal goes through.
	eventually(t, "the directory removed", func() bool { return os.RemoveAll(w.syncer.Dir()) == nil })
	eventually(t, "the directory restored", func() bool {
		got, _ := os.ReadFile(fileA)
		return string(got) == string(want) && exists(fileB)
	})

	if err := os.Remove(w.labels); err != nil {
		t.Fatal(err)
	}
	eventually(t, "labels restored", func() bool { return exists(w.labels) })
	if f := w.syncer.Faults(); len(f) != 0 {
		t.Fatalf("faults: %v", f)
	}
}

// The API clients cannot be built at start (the kubeconfig not written yet): a fault,
// retried, and the sync starts once they can. Before the fix imagepind exited 1 and,
// under systemd, served no local set either.
func TestConnectFailureIsAFaultAndRetried(t *testing.T) {
	w := newWorld(t, setObject("a", "quay.io/x/a"+digest))
	var tries atomic.Int32
	connect := func() (dynamic.Interface, metadata.Interface, error) {
		if tries.Add(1) < 3 {
			return nil, nil, errors.New("kubeconfig: stat /var/lib/kubelet/kubeconfig: no such file or directory")
		}
		return w.dyn, w.meta, nil
	}
	w.syncer = NewConnecting(connect, Config{NodeName: "worker-1", SetsDir: w.dir, LabelsFile: w.labels, Log: logrus.New(),
		Debounce: 10 * time.Millisecond, ConnectRetry: 50 * time.Millisecond})
	w.run(t)
	eventually(t, "a fault naming the kubeconfig", func() bool {
		f := w.syncer.Faults()
		return len(f) == 1 && strings.Contains(f[0], "kubeconfig") && strings.Contains(f[0], "retrying")
	})
	eventually(t, "synced once connected", func() bool {
		_, err := os.Stat(filepath.Join(w.syncer.Dir(), "a.json"))
		return err == nil && len(w.syncer.Faults()) == 0
	})
}

// The API server gone for a while, then back: the first watch from the old
// resourceVersion answers ERROR 410 Expired. The sync must neither call that
// "unreachable" nor wait out client-go's backoff grown during the outage (up to a
// minute): a set created meanwhile reaches the node within seconds. Before the fix the
// fault said "the watch closed at once with no event (API server unreachable …)" and a
// real node followed 44-68 s after a 20 s outage.
func TestAPIReturnAfterOutageIsFollowedWithinSeconds(t *testing.T) {
	w := newWorld(t, setObject("a", "quay.io/x/a"+digest))
	var down, expireNext atomic.Bool
	var mu sync.Mutex
	var faultLog []string
	var open []*watch.FakeWatcher
	w.dyn.PrependReactor("list", "pinnedimagesets", func(k8stesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
		}
		return false, nil, nil
	})
	w.dyn.PrependWatchReactor("pinnedimagesets", func(k8stesting.Action) (bool, watch.Interface, error) {
		if down.Load() {
			return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
		}
		fw := watch.NewFake()
		mu.Lock()
		open = append(open, fw)
		mu.Unlock()
		if expireNext.Swap(false) {
			go func() {
				fw.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired,
					Message: "too old resource version: 1 (5)"})
				fw.Stop()
			}()
		}
		return true, fw, nil
	})
	w.syncer.cfg.ProbeEvery = 100 * time.Millisecond
	w.syncer.cfg.OnFaults = func() {
		mu.Lock()
		defer mu.Unlock()
		faultLog = append(faultLog, strings.Join(w.syncer.Faults(), "; "))
	}
	w.run(t)
	eventually(t, "synced", func() bool {
		_, err := os.Stat(filepath.Join(w.syncer.Dir(), "a.json"))
		return err == nil
	})
	// The outage: every watch open now fails over (the fake ends them), as does every
	// list and watch for 4 s, long enough for the reflector's backoff to grow.
	down.Store(true)
	mu.Lock()
	for _, fw := range open {
		if !fw.IsStopped() {
			fw.Stop()
		}
	}
	mu.Unlock()
	w.dyn.Tracker().Add(setObject("b", "quay.io/x/b"+digest))
	eventually(t, "the outage is a fault", func() bool { return len(w.syncer.Faults()) > 0 })
	time.Sleep(4 * time.Second)
	mu.Lock()
	before := len(faultLog)
	mu.Unlock()
	expireNext.Store(true)
	down.Store(false)
	back := time.Now()
	eventually(t, "the set created during the outage", func() bool {
		_, err := os.Stat(filepath.Join(w.syncer.Dir(), "b.json"))
		return err == nil && len(w.syncer.Faults()) == 0
	})
	if took := time.Since(back); took > 3*time.Second {
		t.Fatalf("followed the API %s after its return", took)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, f := range faultLog[before:] {
		if strings.Contains(f, "closed at once") {
			t.Fatalf("an answering API was called unreachable: %q", f)
		}
	}
}
