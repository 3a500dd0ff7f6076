// Command clusterbench is `make bench-cluster`: the cluster loop at scale against a real
// kube-apiserver and etcd on this machine.
//
//  1. Propagation: N simulated nodes each run the real cluster sync (package clustersync,
//     its own informers and files), sharing one client certificate per group of 100
//     (HTTP/2 streams); one PinnedImageSet is created; the time from the create to each
//     node's file written is recorded (p50, p99, max).
//  2. Rollout: the real imagepin-aggregator --cluster (defaults: one write per set per
//     10 s, 5 writes/s overall) takes reports from N nodes, each with its own kubelet-style
//     certificate, as they go from 0 to Ready over the rollout; status writes to the API
//     are counted from the API server's own metrics (apiserver_request_total, PATCH on
//     pinnedimagesets/status) and reported per second; its RSS at the end.
//  3. imagepind idle RSS with and without [cluster] (the API watch), side by side.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
	"github.com/imagepin/imagepin/api/v1alpha1"
	"github.com/imagepin/imagepin/clustersync"
	"github.com/imagepin/imagepin/internal/kube"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
)

var (
	nodes   = flag.Int("nodes", 5000, "simulated nodes (Node objects, syncers and reporters)")
	group   = flag.Int("group", 100, "simulated nodes sharing one client certificate")
	rollout = flag.Duration("rollout", 60*time.Second, "how long the simulated rollout takes")
	binDir  = flag.String("bin", "bin", "directory with imagepin-aggregator and imagepind")
	idle    = flag.Duration("idle", 20*time.Second, "how long imagepind idles before its RSS is read")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "clusterbench:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

func run() error {
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "clusterbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	os.MkdirAll(filepath.Join(dir, "kube"), 0o755)
	k, err := env.StartKube(filepath.Join(dir, "kube"))
	if err != nil {
		return err
	}
	defer k.Stop()
	ctx := context.Background()
	rc := k.AdminConfig()
	rc.QPS, rc.Burst = 500, 1000
	dyn := dynamic.NewForConfigOrDie(rc)
	cs := kubernetes.NewForConfigOrDie(rc)
	if err := install(ctx, dyn); err != nil {
		return err
	}

	// N Node objects (the targets).
	start := time.Now()
	if err := parallel(*nodes, 16, func(i int) error {
		_, err := cs.CoreV1().Nodes().Create(ctx, nodeObject(nodeName(i)), metav1.CreateOptions{})
		return err
	}); err != nil {
		return err
	}
	logf("%d Node objects in %s", *nodes, time.Since(start).Round(time.Millisecond))

	// 1. Propagation through N real cluster syncs.
	prop, err := propagation(ctx, k, dyn, dir)
	if err != nil {
		return err
	}

	// 2. Rollout with the real aggregator.
	ro, err := rolloutBench(ctx, k, dyn, cs, dir)
	if err != nil {
		return err
	}

	// 3. imagepind idle RSS, with and without the API watch.
	withAPI, withoutAPI, err := imagepindRSS(k, dir)
	if err != nil {
		return err
	}

	fmt.Printf("## Cluster loop at %d nodes (real kube-apiserver 1.35.4 + etcd 3.6.6, loopback, 2 cores)\n\n", *nodes)
	fmt.Printf("| measure | value |\n|---|---|\n")
	fmt.Printf("| apply → file on every node: p50 / p99 / max | %s / %s / %s |\n", prop[0], prop[1], prop[2])
	fmt.Printf("| rollout: status writes (PATCH pinnedimagesets/status) | %d in %s |\n", ro.writes, ro.duration.Round(time.Second))
	fmt.Printf("| rollout: status writes per second, mean / max in any 1 s | %.2f / %d |\n", float64(ro.writes)/ro.duration.Seconds(), ro.maxPerSecond)
	fmt.Printf("| baseline: one status write per node report (what a naive writer does) | %d (%.0f/s) |\n", ro.reports, float64(ro.reports)/ro.duration.Seconds())
	fmt.Printf("| last node Ready → status Ready %d/%d in the API | %s |\n", *nodes, *nodes, ro.settle.Round(100*time.Millisecond))
	fmt.Printf("| aggregator RSS at the end | %d MiB |\n", ro.rssKiB/1024)
	fmt.Printf("| imagepind idle RSS, [cluster] on / off | %d MiB / %d MiB |\n", withAPI/1024, withoutAPI/1024)
	return nil
}

func nodeName(i int) string { return fmt.Sprintf("worker-%05d", i) }

func nodeObject(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"node-role.kubernetes.io/worker": ""}}}
}

func parallel(n, width int, f func(i int) error) error {
	var wg sync.WaitGroup
	sem := make(chan struct{}, width)
	var mu sync.Mutex
	var first error
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	return first
}

func install(ctx context.Context, dyn dynamic.Interface) error {
	crd, err := v1alpha1.CRD()
	if err != nil {
		return err
	}
	if err := env.Create(ctx, dyn, crd); err != nil {
		return err
	}
	for _, f := range []string{"packaging/aggregator/namespace.yaml", "packaging/aggregator/rbac.yaml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if err := env.ApplyYAML(ctx, dyn, b); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	for i := 0; i < 100; i++ {
		if _, err := dyn.Resource(v1alpha1.GroupVersionResource).List(ctx, metav1.ListOptions{}); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the CRD is not served")
}

// writeHook records when a syncer wrote a set's file.
type writeHook struct {
	file string
	mu   *sync.Mutex
	at   *[]time.Time
}

func (h writeHook) Levels() []logrus.Level { return []logrus.Level{logrus.InfoLevel} }
func (h writeHook) Fire(e *logrus.Entry) error {
	if e.Message == "set from the API written" && e.Data["file"] == h.file {
		h.mu.Lock()
		*h.at = append(*h.at, time.Now())
		h.mu.Unlock()
	}
	return nil
}

func propagation(ctx context.Context, k *env.Kube, dyn dynamic.Interface, dir string) ([3]time.Duration, error) {
	var out [3]time.Duration
	var mu sync.Mutex
	var writes []time.Time
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hook := writeHook{file: "cluster/bench.json", mu: &mu, at: &writes}
	groups := (*nodes + *group - 1) / *group
	start := time.Now()
	var syncers sync.WaitGroup
	for g := 0; g < groups; g++ {
		gdir := filepath.Join(dir, "nodes", strconv.Itoa(g))
		kubeconfig, _, err := k.NodeKubeconfig(gdir0(gdir), nodeName(g), "")
		if err != nil {
			return out, err
		}
		rc, err := kubeRest(kubeconfig)
		if err != nil {
			return out, err
		}
		d := dynamic.NewForConfigOrDie(rc)
		m := metadata.NewForConfigOrDie(rc)
		for i := g * *group; i < min((g+1)*(*group), *nodes); i++ {
			setsDir := filepath.Join(gdir, strconv.Itoa(i), "sets.d")
			os.MkdirAll(setsDir, 0o755)
			log := logrus.New()
			log.SetOutput(io.Discard)
			log.AddHook(hook)
			s := clustersync.New(d, m, clustersync.Config{NodeName: nodeName(g), SetsDir: setsDir,
				LabelsFile: filepath.Join(gdir, strconv.Itoa(i), "labels.json"), Log: log})
			syncers.Add(1)
			go func() { defer syncers.Done(); s.Run(sctx) }()
		}
	}
	// Every syncer has listed (and written its labels file) before the apply.
	for {
		n := 0
		filepath.Walk(filepath.Join(dir, "nodes"), func(p string, info os.FileInfo, err error) error {
			if err == nil && info.Name() == "labels.json" {
				n++
			}
			return nil
		})
		if n == *nodes {
			break
		}
		if time.Since(start) > 10*time.Minute {
			return out, fmt.Errorf("only %d of %d syncers in step", n, *nodes)
		}
		time.Sleep(500 * time.Millisecond)
	}
	logf("%d cluster syncs in step in %s", *nodes, time.Since(start).Round(time.Millisecond))

	applied := time.Now()
	set := benchSet("bench", "quay.io/imagepin/bench@sha256:"+strings.Repeat("ab", 32))
	if _, err := dyn.Resource(v1alpha1.GroupVersionResource).Create(ctx, set, metav1.CreateOptions{}); err != nil {
		return out, err
	}
	for {
		mu.Lock()
		n := len(writes)
		mu.Unlock()
		if n >= *nodes || time.Since(applied) > 5*time.Minute {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	lat := make([]time.Duration, len(writes))
	for i, w := range writes {
		lat[i] = w.Sub(applied)
	}
	mu.Unlock()
	cancel()
	syncers.Wait()
	if len(lat) < *nodes {
		return out, fmt.Errorf("only %d of %d nodes got the file", len(lat), *nodes)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	out = [3]time.Duration{lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)*99/100].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond)}
	logf("propagation p50 %s p99 %s max %s", out[0], out[1], out[2])
	return out, nil
}

func gdir0(d string) string { os.MkdirAll(d, 0o755); return d }

func benchSet(name string, images ...string) *unstructured.Unstructured {
	var list []any
	for _, i := range images {
		list = append(list, map[string]any{"name": i})
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.APIVersion, "kind": v1alpha1.Kind, "metadata": map[string]any{"name": name},
		"spec": map[string]any{"nodeSelector": map[string]any{"matchLabels": map[string]any{"node-role.kubernetes.io/worker": ""}}, "pinnedImages": list},
	}}
}

type rolloutResult struct {
	writes, reports  int
	maxPerSecond     int
	duration, settle time.Duration
	rssKiB           int64
}

func rolloutBench(ctx context.Context, k *env.Kube, dyn dynamic.Interface, cs *kubernetes.Clientset, dir string) (rolloutResult, error) {
	var res rolloutResult
	const setName = "rollout"
	obj, err := dyn.Resource(v1alpha1.GroupVersionResource).Create(ctx, benchSet(setName, "quay.io/imagepin/rollout@sha256:"+strings.Repeat("cd", 32)), metav1.CreateOptions{})
	if err != nil {
		return res, err
	}
	doc, _ := v1alpha1.NodeDocument(obj)
	parsed, err := pinset.ParseSetFile("cluster/rollout.json", doc)
	if err != nil {
		return res, err
	}
	specHash := parsed.Sets[0].SpecHash

	tok, err := cs.CoreV1().ServiceAccounts("imagepin").CreateToken(ctx, "imagepin-aggregator",
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(7200))}}, metav1.CreateOptions{})
	if err != nil {
		return res, err
	}
	aggKubeconfig := filepath.Join(dir, "aggregator.kubeconfig")
	if err := k.TokenKubeconfig(aggKubeconfig, tok.Status.Token); err != nil {
		return res, err
	}
	cert, key, err := k.ServerCA.Server(dir, "aggregator")
	if err != nil {
		return res, err
	}
	gp, _ := env.FreePort()
	hp, _ := env.FreePort()
	grpcAddr := "127.0.0.1:" + strconv.Itoa(gp)
	agg := exec.Command(filepath.Join(*binDir, "imagepin-aggregator"), "--grpc-address", grpcAddr, "--http-address", "127.0.0.1:"+strconv.Itoa(hp),
		"--tls-cert", cert, "--tls-key", key, "--client-ca", k.ClientCA.File, "--max-nodes", strconv.Itoa(*nodes*2),
		"--cluster", "--kubeconfig", aggKubeconfig, "--leader-elect-namespace", "imagepin", "--leader-elect-identity", "bench", "--log-level", "warn")
	agg.Stderr = os.Stderr
	if err := agg.Start(); err != nil {
		return res, err
	}
	defer func() { agg.Process.Signal(os.Interrupt); agg.Wait() }()

	// N reporters with their own certificates.
	certs := make([]tls.Certificate, *nodes)
	os.MkdirAll(filepath.Join(dir, "certs"), 0o755)
	for i := range certs {
		p, err := k.ClientCA.Node(filepath.Join(dir, "certs"), nodeName(i))
		if err != nil {
			return res, err
		}
		if certs[i], err = tls.LoadX509KeyPair(p, p); err != nil {
			return res, err
		}
	}
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(k.ServerCA.File)
	pool.AppendCertsFromPEM(caPEM)
	clients := make([]v1.ReportsClient, *nodes)
	for i := range clients {
		c, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{certs[i]}, RootCAs: pool})))
		if err != nil {
			return res, err
		}
		defer c.Close()
		clients[i] = v1.NewReportsClient(c)
	}
	// Wait for the aggregator to lead (it listens then).
	for i := 0; ; i++ {
		if _, err := clients[0].Report(ctx, report(0, specHash, 1, 0)); err == nil {
			break
		}
		if i > 300 {
			return res, fmt.Errorf("the aggregator never took reports")
		}
		time.Sleep(100 * time.Millisecond)
	}
	before, err := statusPatches(k)
	if err != nil {
		return res, err
	}
	// The rollout: 10 steps from 0% to Ready, each node at its own pace within the window.
	const steps = 10
	perSecond := map[int]int{}
	start := time.Now()
	var mu sync.Mutex
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		prev := before
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for s := 0; ; s++ {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			cur, err := statusPatches(k)
			if err != nil {
				continue
			}
			mu.Lock()
			perSecond[s] = cur - prev
			mu.Unlock()
			prev = cur
		}
	}()
	var reports int64
	var rmu sync.Mutex
	err = parallel(*nodes, 128, func(i int) error {
		pace := *rollout * time.Duration(50+i%50) / 100 // the slowest nodes take the whole window
		for step := 0; step <= steps; step++ {
			at := start.Add(pace * time.Duration(step) / steps)
			time.Sleep(time.Until(at))
			if _, err := clients[i].Report(ctx, report(i, specHash, uint64(step+2), step*100/steps)); err != nil {
				return err
			}
			rmu.Lock()
			reports++
			rmu.Unlock()
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	lastReady := time.Now()
	res.duration = lastReady.Sub(start)
	// Settle: the API says N/N Ready.
	for {
		u, err := dyn.Resource(v1alpha1.GroupVersionResource).Get(ctx, setName, metav1.GetOptions{})
		if err == nil {
			if n, _, _ := unstructured.NestedString(u.Object, "status", "nodes"); n == fmt.Sprintf("%d/%d", *nodes, *nodes) {
				break
			}
		}
		if time.Since(lastReady) > 2*time.Minute {
			return res, fmt.Errorf("status never reached %d/%d", *nodes, *nodes)
		}
		time.Sleep(100 * time.Millisecond)
	}
	res.settle = time.Since(lastReady)
	close(stop)
	sampler.Wait()
	after, err := statusPatches(k)
	if err != nil {
		return res, err
	}
	res.writes = after - before
	mu.Lock()
	for _, n := range perSecond {
		res.maxPerSecond = max(res.maxPerSecond, n)
	}
	mu.Unlock()
	res.reports = int(reports)
	res.rssKiB = env.RSSKiB(agg.Process.Pid)
	logf("rollout: %d writes in %s, max %d/s; settled %s after the last node; aggregator RSS %d MiB", res.writes, res.duration.Round(time.Second), res.maxPerSecond, res.settle.Round(100*time.Millisecond), res.rssKiB/1024)
	return res, nil
}

func report(i int, specHash string, seq uint64, pct int) *v1.NodeReport {
	phase := status.Pulling
	if pct >= 100 {
		phase = status.Ready
	}
	total := uint64(500 << 20)
	n := status.Node{Node: status.NodeInfo{Name: nodeName(i)}, Sets: []status.Set{{
		Name: "rollout", SpecHash: specHash, File: "cluster/rollout.json", Phase: phase, ImagesTotal: 100, ImagesReady: pct,
		BytesTotal: total, BytesReady: total * uint64(pct) / 100,
	}}}
	return v1.FromStatus(n, "boot-1", seq, 30*time.Second)
}

// statusPatches reads the API server's own count of PATCH requests on the status subresource.
func statusPatches(k *env.Kube) (int, error) {
	rc := k.AdminConfig()
	tr, err := rest.TransportFor(rc)
	if err != nil {
		return 0, err
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(k.URL + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	total := 0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "apiserver_request_total{") && strings.Contains(line, `resource="pinnedimagesets"`) &&
			strings.Contains(line, `subresource="status"`) && strings.Contains(line, `verb="PATCH"`) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			total += int(v)
		}
	}
	return total, nil
}

func imagepindRSS(k *env.Kube, dir string) (withAPI, withoutAPI int64, err error) {
	for _, cluster := range []bool{true, false} {
		d := filepath.Join(dir, fmt.Sprintf("imagepind-%v", cluster))
		os.MkdirAll(filepath.Join(d, "sets.d"), 0o755)
		cfg := fmt.Sprintf("sets_dir = %q\nstate_dir = %q\nstatus_file = %q\n[node]\nname = %q\nlabels_file = %q\n[cri]\nendpoint = \"unix://%s/none.sock\"\npull_secret = \"\"\n[crio]\nconfig = %q\nconfig_dir = %q\nreload = \"signal\"\n[disk]\nkubelet_config = \"\"\n",
			filepath.Join(d, "sets.d"), filepath.Join(d, "state"), filepath.Join(d, "status.json"), nodeName(0), filepath.Join(d, "labels.json"), d,
			filepath.Join(d, "crio.conf"), filepath.Join(d, "crio.conf.d"))
		if cluster {
			kc, _, err := k.NodeKubeconfig(d, nodeName(0), "")
			if err != nil {
				return 0, 0, err
			}
			cfg += fmt.Sprintf("[cluster]\nkubeconfig = %q\n", kc)
		}
		os.WriteFile(filepath.Join(d, "imagepind.toml"), []byte(cfg), 0o644)
		cmd := exec.Command(filepath.Join(*binDir, "imagepind"), "--config", filepath.Join(d, "imagepind.toml"), "--log-level", "warn")
		logFile, _ := os.Create(filepath.Join(d, "log"))
		cmd.Stdout, cmd.Stderr = logFile, logFile
		if err := cmd.Start(); err != nil {
			return 0, 0, err
		}
		time.Sleep(*idle)
		r := env.RSSKiB(cmd.Process.Pid)
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
		logFile.Close()
		if cluster {
			if _, err := os.Stat(filepath.Join(d, "sets.d", "cluster", "bench.json")); err != nil {
				b, _ := os.ReadFile(filepath.Join(d, "log"))
				return 0, 0, fmt.Errorf("imagepind with [cluster] did not sync: %v\n%s", err, b)
			}
			withAPI = r
		} else {
			withoutAPI = r
		}
	}
	logf("imagepind idle RSS: cluster %d KiB, files only %d KiB", withAPI, withoutAPI)
	return withAPI, withoutAPI, nil
}

func ptr[T any](v T) *T { return &v }

func kubeRest(kubeconfig string) (*rest.Config, error) {
	return kube.Config(kubeconfig, "clusterbench", 50, 100)
}
