package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
	"github.com/imagepin/imagepin/test/goals"
)

var (
	rolloutMiB  = flag.Int("rollout-mib", 16, "cluster-rollout: the app image's own layer (MiB of random bytes)")
	rolloutReps = flag.Int("rollout-reps", 3, "cluster-rollout: repetitions")
	rolloutLink = flag.String("rollout-link", "100ms:12500", "cluster-rollout: the link between the nodes and the registry, latency:KB/s (a WAN: 100 ms, a shared 100 Mbit/s; 0s:0 loopback); the peers are on the LAN (loopback)")
)

const benchTaint = "imagepin.io/images-not-ready"

// clusterRollout measures, on a whole cluster (test/env.StartCluster: kube-apiserver,
// controller-manager, scheduler and three registered kubelets 1.35.4, node-2 on
// containerd, imagepind with peers, two aggregators), what an administrator sees with
// the registry gone against what they see with it up:
//   - a Deployment's rollout (3 replicas, surge 1) to an image the kubelets pull from the
//     registry behind the WAN link (-rollout-link), against one to an image a set
//     pinned, the registry cut;
//   - a node that joins: registration → its sets Ready, pulled from the registry on
//     behind that link alone ([peers] off, no taint), against registration → its startup taint
//     removed, the registry cut (sets from peers; the taint goes when the node's
//     condition says its sets are Ready). From the second repetition on, the held-back
//     node replaces the one of the repetition before, taken out just before it joins.
func (b *bench) clusterRollout(ctx context.Context) error {
	dir := filepath.Join(b.dir, "cluster-rollout")
	if err := os.MkdirAll(filepath.Join(dir, "registry"), 0o755); err != nil {
		return err
	}
	reg, err := env.StartRegistry(filepath.Join(dir, "registry"))
	if err != nil {
		return err
	}
	defer reg.Stop()
	links, err := parseLinks(*rolloutLink + ":1")
	if err != nil || len(links) != 1 {
		return fmt.Errorf("-rollout-link %q: latency:KB/s", *rolloutLink)
	}
	lat, kbps := links[0].latency, links[0].kbps
	linkText := "on loopback"
	if lat > 0 || kbps > 0 {
		linkText = fmt.Sprintf("behind a link of %s and %d KB/s shared (the peers on loopback)", lat, kbps)
	}
	link, err := env.StartLink(reg.Host, kbps*1000, lat)
	if err != nil {
		return err
	}
	defer link.Close()
	app := filepath.Join(dir, "podapp")
	if err := env.GoBuild(app, "github.com/imagepin/imagepin/test/podapp", "-s -w"); err != nil {
		return err
	}
	push := func(repo string, mib int) (string, error) {
		var extra []v1.Layer
		if mib > 0 {
			l, err := env.RandomLayer(int64(mib) << 20)
			if err != nil {
				return "", err
			}
			extra = append(extra, l)
		}
		img, err := reg.PushRunnableWith(ctx, repo, app, extra...)
		if err != nil {
			return "", err
		}
		return strings.Replace(img.Ref(), reg.Host, link.Addr, 1), nil
	}
	pause, err := push("pause", 0)
	if err != nil {
		return err
	}
	v0, err := push("shop/app", *rolloutMiB)
	if err != nil {
		return err
	}
	c, err := env.StartCluster(ctx, filepath.Join(dir, "cluster"), env.ClusterOptions{
		Nodes: 3, ContainerdNodes: []int{2}, Bin: *binDir, Packaging: filepath.Join("packaging", "aggregator"),
		Insecure: []string{link.Addr}, PauseImage: pause, PullSecret: []byte(`{"auths":{}}`),
	})
	if err != nil {
		return err
	}
	defer c.Stop()
	kubectl := func(args ...string) error {
		out, err := c.Kubectl(ctx, args...)
		if err != nil {
			return fmt.Errorf("%s: %w\n%s", env.KubectlCommand(args...), err, out)
		}
		return nil
	}
	apply := func(name, doc string) error {
		p := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
			return err
		}
		return kubectl("apply", "-f", p)
	}
	setDoc := func(name string, refs ...string) string {
		doc := "apiVersion: imagepin.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: " + name + "}\nspec:\n  nodeSelector: {}\n  pinnedImages:\n"
		for _, r := range refs {
			doc += "  - name: " + r + "\n"
		}
		return doc
	}
	if err := apply("base", setDoc("base", pause)); err != nil {
		return err
	}
	if err := kubectl("wait", "--for=condition=Ready", "pis/base", "--timeout=300s"); err != nil {
		return err
	}
	if err := apply("app", fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: app, namespace: default}
spec:
  replicas: 3
  selector: {matchLabels: {app: app}}
  strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  template:
    metadata: {labels: {app: app}}
    spec:
      hostNetwork: true
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 2
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule,
         labelSelector: {matchLabels: {app: app}}, matchLabelKeys: [pod-template-hash]}
      containers:
      - {name: app, image: %s, imagePullPolicy: IfNotPresent}
`, v0)); err != nil {
		return err
	}
	if err := kubectl("rollout", "status", "deployment/app", "--timeout=300s"); err != nil {
		return err
	}
	rollout := func(image string) (time.Duration, error) {
		start := time.Now()
		if err := kubectl("set", "image", "deployment/app", "app="+image); err != nil {
			return 0, err
		}
		err := kubectl("rollout", "status", "deployment/app", "--timeout=300s")
		return time.Since(start), err
	}
	// setsReady is when every set of names is Ready on node n (from its status file).
	setsReady := func(n *env.ClusterNode, names ...string) bool {
		st := n.Status()
		for _, s := range names {
			if x := st.Set(s); x == nil || x.Phase != status.Ready {
				return false
			}
		}
		return true
	}
	untainted := func(name string) bool {
		node, err := c.CS.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		return err == nil && !slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == benchTaint })
	}
	poll := func(what string, timeout time.Duration, cond func() bool) error {
		deadline := time.Now().Add(timeout)
		for !cond() {
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: not after %s", what, timeout)
			}
			time.Sleep(100 * time.Millisecond)
		}
		return nil
	}

	var up, gone, alone, held, heldSets, readyToUntainted []time.Duration
	var joins []joinTimes
	var replaced *env.ClusterNode // the node that joined held back, replaced in the next repetition
	untaint, err := watchUntaint(ctx, c.CS)
	if err != nil {
		return err
	}
	var goneBytes int64
	prevSet := ""
	for rep := range *rolloutReps {
		// The registry up: the kubelets pull the new image.
		img, err := push("shop/app", *rolloutMiB)
		if err != nil {
			return err
		}
		took, err := rollout(img)
		if err != nil {
			return err
		}
		up = append(up, took)

		// The registry gone: the new image pinned by a set first.
		if img, err = push("shop/app", *rolloutMiB); err != nil {
			return err
		}
		set := fmt.Sprintf("app-%d", rep)
		if err := apply(set, setDoc(set, img)); err != nil {
			return err
		}
		if err := kubectl("wait", "--for=condition=Ready", "pis/"+set, "--timeout=300s"); err != nil {
			return err
		}
		if prevSet != "" {
			if err := kubectl("delete", "pis", prevSet); err != nil {
				return err
			}
		}
		prevSet = set
		link.Cut()
		before := link.Down.Load()
		took, err = rollout(img)
		goneBytes += link.Down.Load() - before
		link.Restore()
		if err != nil {
			return err
		}
		gone = append(gone, took)

		// A node that pulls its sets from the registry alone, over the link.
		n, err := c.AddNode(ctx, env.NodeOptions{NoPeers: true})
		if err != nil {
			return err
		}
		if err := poll(n.Name+"'s sets Ready from the registry", 300*time.Second, func() bool { return setsReady(n, "base", set) }); err != nil {
			return err
		}
		alone = append(alone, time.Since(n.Started))
		if err := c.RemoveNode(ctx, n.Name); err != nil {
			return err
		}

		// A node held back by the startup taint, the registry gone: its sets from peers.
		// It replaces the one that joined so in the repetition before: that one is
		// taken out just before (the aggregator may still name it).
		link.Cut()
		if replaced != nil {
			if err := c.RemoveNode(ctx, replaced.Name); err != nil {
				link.Restore()
				return err
			}
			replaced = nil
		}
		n, err = c.AddNode(ctx, env.NodeOptions{Taints: []string{benchTaint + ":NoSchedule"}})
		if err != nil {
			link.Restore()
			return err
		}
		err = poll(n.Name+"'s sets Ready from peers", 300*time.Second, func() bool { return setsReady(n, "base", set) })
		ready := time.Since(n.Started)
		if err == nil {
			heldSets = append(heldSets, ready)
			// The taint goes when the node's condition says so; a build without that
			// leaves it, and the row says so.
			if poll(n.Name+"'s startup taint removed", 60*time.Second, func() bool { return untainted(n.Name) }) == nil {
				held = append(held, time.Since(n.Started))
				poll("the watch seeing "+n.Name+"'s taint gone", 10*time.Second, func() bool { return !untaint.at(n.Name).IsZero() })
				jt := readJoin(n.Log, n.Started, untaint.at(n.Name))
				joins = append(joins, jt)
				if r, ok := jt["sets Ready"]; ok && !untaint.at(n.Name).IsZero() {
					readyToUntainted = append(readyToUntainted, jt["startup taint gone (watch)"]-r)
				}
			}
		}
		link.Restore()
		if err != nil {
			return err
		}
		replaced = n
	}

	fmt.Printf("## A whole cluster with the registry gone: rollout and node join\n\n")
	fmt.Printf("Real kube-apiserver, kube-controller-manager, kube-scheduler and kubelets (3 nodes: 2 CRI-O, 1 containerd), imagepind with peers on each, 2 aggregators; a Deployment of 3 replicas (surge 1, maxUnavailable 0, hostNetwork), its image %d MiB of its own; the registry %s; %d repetitions, medians.\n\n", *rolloutMiB, linkText, *rolloutReps)
	fmt.Printf("| measure | median | runs |\n|---|---|---|\n")
	row := func(name string, ds []time.Duration) {
		fmt.Printf("| %s | %s | %s |\n", name, median(ds).Round(10*time.Millisecond), durations(ds))
	}
	row("rollout, registry up (each kubelet pulls the new image)", up)
	row("rollout, registry gone (the new image in a Ready set)", gone)
	fmt.Printf("| ratio gone ÷ up (goal ≤ 1.0) | %.2f | %d bytes crossed the registry's link while it was cut |\n", ratio(gone, up), goneBytes)
	row("node join: kubelet start → its sets Ready, from the registry "+linkText+" alone ([peers] off)", alone)
	row("node join, registry gone: kubelet start → its sets Ready from peers", heldSets)
	fromRegistry := fmt.Sprintf("the same node, [peers] off, its sets Ready from the registry %s: %s", linkText, median(alone).Round(10*time.Millisecond))
	readyAt := fmt.Sprintf("its sets Ready from peers %s after kubelet start", median(heldSets).Round(10*time.Millisecond))
	if len(held) == len(heldSets) && len(held) > 0 {
		row("node join, registry gone: kubelet start → startup taint removed", held)
		row("node join, registry gone: sets Ready → startup taint removed (goal ≤ 0.5 s; imagepind's log, the API's watch)", readyToUntainted)
		fmt.Printf("| ratio taint removed ÷ registry alone (goal ≤ 1.0) | %.2f | |\n\n", ratio(held, alone))
		b.goals.Measured(goalJoinTaint, goals.Measurement{Value: ratio(held, alone), Detail: "taint removed " + median(held).Round(10*time.Millisecond).String() + " after kubelet start", Baseline: fromRegistry})
		if len(readyToUntainted) > 0 {
			b.goals.Measured(goalReadyTaint, goals.Measurement{Value: median(readyToUntainted).Seconds(), Baseline: readyAt})
		}
		printJoinTimeline(joins)
	} else {
		fmt.Printf("| node join, registry gone: kubelet start → startup taint removed | not removed within 60 s of the sets Ready (%d of %d runs): this build does not remove the taint | |\n", len(held), len(heldSets))
		fmt.Printf("| ratio sets Ready from peers ÷ registry alone | %.2f | |\n\n", ratio(heldSets, alone))
		if len(heldSets) > 0 {
			missed := fmt.Sprintf("taint not removed within 60 s of the sets Ready in %d of %d runs", len(heldSets)-len(held), len(heldSets))
			b.goals.Measured(goalJoinTaint, goals.Measurement{Missed: missed, Baseline: fromRegistry})
			b.goals.Measured(goalReadyTaint, goals.Measurement{Missed: missed, Baseline: readyAt})
		}
	}
	return nil
}

func ratio(a, b []time.Duration) float64 {
	if median(b) == 0 {
		return 0
	}
	return float64(median(a)) / float64(median(b))
}

func durations(ds []time.Duration) string {
	var s []string
	for _, d := range ds {
		s = append(s, d.Round(10*time.Millisecond).String())
	}
	return strings.Join(s, ", ")
}
