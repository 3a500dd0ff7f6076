// Package giveback gives every node back when imagepin is uninstalled from a cluster
// (the Helm chart's pre-delete hook, `imagepinctl uninstall-nodes`): it puts imagepind's
// DaemonSet in uninstall mode, in which each node's imagepind restores the runtime's
// configuration, releases its pins and removes its blob store, then says so through its
// readiness and waits; it waits until the pod of every node the DaemonSet runs on is in
// that mode and ready; then it removes what imagepin left on the Nodes: the condition
// PinnedImagesReady and the startup taint. A node not given back in time fails the
// whole, naming the node and why, and leaves every Node as it was.
package giveback

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// Config names the DaemonSet and what uninstall mode runs.
type Config struct {
	Namespace, DaemonSet string
	// Container is imagepind's container in the DaemonSet's pods.
	Container string
	// Command is imagepind in uninstall mode (it gives the node back, then waits);
	// Ready the readiness probe's command that succeeds once the node is given back.
	Command, Ready []string
	// Condition is the Node condition type imagepind writes; StartupTaint the taint key
	// nodes may register with ("": none).
	Condition, StartupTaint string
	// Timeout bounds the wait for the nodes; Poll is how often they are looked at
	// (0: 2 s).
	Timeout, Poll time.Duration
	Log           logrus.FieldLogger
}

// FieldManager names imagepin's uninstall in the objects' managed fields.
const FieldManager = "imagepin-uninstall"

// NotGivenBack is the error of nodes not given back within the timeout: each such node
// with why, and how many the DaemonSet wants that have no pod at all.
type NotGivenBack struct {
	Nodes     []NodeState
	NoPod     int
	Desired   int
	Timeout   time.Duration
	DaemonSet string
}

// NodeState is one node's imagepind pod and why it is not done.
type NodeState struct {
	Node, Pod, Why string
}

func (e *NotGivenBack) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d nodes not given back within %s:", len(e.Nodes)+e.NoPod, e.Desired, e.Timeout)
	for i, n := range e.Nodes {
		if i > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %s (pod %s: %s)", n.Node, n.Pod, n.Why)
	}
	if e.NoPod > 0 {
		if len(e.Nodes) > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %d without a pod of DaemonSet %s yet", e.NoPod, e.DaemonSet)
	}
	return b.String()
}

// Result is what Run did.
type Result struct {
	// Nodes is how many nodes were given back; Conditions and Taints how many Node
	// conditions and startup taints were removed.
	Nodes, Conditions, Taints int
}

// Run gives every node back; see the package doc.
func Run(ctx context.Context, cs kubernetes.Interface, cfg Config) (Result, error) {
	if cfg.Poll == 0 {
		cfg.Poll = 2 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	if len(cfg.Command) == 0 || len(cfg.Ready) == 0 {
		return Result{}, errors.New("give nodes back: no uninstall command or readiness command")
	}
	log := cfg.Log.WithField("daemonset", cfg.Namespace+"/"+cfg.DaemonSet)
	var res Result
	ds, err := cs.AppsV1().DaemonSets(cfg.Namespace).Get(ctx, cfg.DaemonSet, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		// Nothing runs imagepind: nothing can give a node back. Its marks on the
		// Nodes still go.
		log.Warn("no DaemonSet: no node's imagepind to give it back; removing imagepin's marks from the Nodes only")
	case err != nil:
		return res, fmt.Errorf("get DaemonSet %s/%s: %w", cfg.Namespace, cfg.DaemonSet, err)
	default:
		if err := setUninstallMode(ctx, cs, ds, cfg); err != nil {
			return res, err
		}
		log.WithField("command", strings.Join(cfg.Command, " ")).Info("imagepind put in uninstall mode on every node")
		if res.Nodes, err = wait(ctx, cs, cfg, log); err != nil {
			return res, err
		}
	}
	res.Conditions, res.Taints, err = unmarkNodes(ctx, cs, cfg, log)
	return res, err
}

// setUninstallMode patches the DaemonSet: the container runs cfg.Command with cfg.Ready
// as its readiness, and every node's pod is replaced at once (maxUnavailable 100%: a
// node's imagepind stopping keeps its pins, and the next one gives the node back).
func setUninstallMode(ctx context.Context, cs kubernetes.Interface, ds *appsv1.DaemonSet, cfg Config) error {
	if !slices.ContainsFunc(ds.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return c.Name == cfg.Container }) {
		return fmt.Errorf("DaemonSet %s/%s has no container %s", cfg.Namespace, cfg.DaemonSet, cfg.Container)
	}
	all := intstr.FromString("100%")
	zero := intstr.FromInt32(0)
	patch := map[string]any{
		"spec": map[string]any{
			"updateStrategy": appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxUnavailable: &all, MaxSurge: &zero}},
			"template": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{
				"name":    cfg.Container,
				"command": cfg.Command,
				"args":    []string{},
				"readinessProbe": corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: cfg.Ready}},
					PeriodSeconds: 2, TimeoutSeconds: 10, SuccessThreshold: 1, FailureThreshold: 1,
				},
			}}}},
		},
	}
	b, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	if _, err := cs.AppsV1().DaemonSets(cfg.Namespace).Patch(ctx, cfg.DaemonSet, types.StrategicMergePatchType, b,
		metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
		return fmt.Errorf("put DaemonSet %s/%s in uninstall mode: %w", cfg.Namespace, cfg.DaemonSet, err)
	}
	return nil
}

// wait polls until the pod of every node the DaemonSet wants is in uninstall mode and
// ready, and no pod in another mode is left; it returns how many nodes that is, or
// NotGivenBack at the timeout.
func wait(ctx context.Context, cs kubernetes.Interface, cfg Config, log logrus.FieldLogger) (int, error) {
	deadline := time.Now().Add(cfg.Timeout)
	last := -1
	for {
		done, err := look(ctx, cs, cfg)
		if err == nil && done.pending() == 0 {
			log.WithField("nodes", done.desired).Info("every node given back")
			return done.desired, nil
		}
		if err != nil {
			log.WithError(err).Warn("looking at the nodes failed; looking again")
		} else if n := done.desired - done.pending(); n != last {
			log.WithField("given back", n).WithField("nodes", done.desired).Info("nodes given back so far")
			last = n
		}
		if !time.Now().Before(deadline) {
			if err != nil {
				return 0, fmt.Errorf("give nodes back: within %s: %w", cfg.Timeout, err)
			}
			return 0, &NotGivenBack{Nodes: done.notDone, NoPod: done.noPod(), Desired: done.desired, Timeout: cfg.Timeout, DaemonSet: cfg.DaemonSet}
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(min(cfg.Poll, time.Until(deadline))):
		}
	}
}

// seen is one look at the DaemonSet and its pods.
type seen struct {
	desired int
	// given are the nodes whose pod is in uninstall mode and ready; notDone the others
	// with a pod.
	given   int
	notDone []NodeState
}

func (s seen) noPod() int   { return max(s.desired-s.given-len(s.notDone), 0) }
func (s seen) pending() int { return len(s.notDone) + s.noPod() }

func look(ctx context.Context, cs kubernetes.Interface, cfg Config) (seen, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ds, err := cs.AppsV1().DaemonSets(cfg.Namespace).Get(ctx, cfg.DaemonSet, metav1.GetOptions{})
	if err != nil {
		return seen{}, fmt.Errorf("get DaemonSet %s/%s: %w", cfg.Namespace, cfg.DaemonSet, err)
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		return seen{}, fmt.Errorf("DaemonSet %s/%s: selector: %w", cfg.Namespace, cfg.DaemonSet, err)
	}
	pods, err := cs.CoreV1().Pods(cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return seen{}, fmt.Errorf("list the pods of DaemonSet %s/%s: %w", cfg.Namespace, cfg.DaemonSet, err)
	}
	// The nodes the DaemonSet runs on (the patch changes the template, not where).
	s := seen{desired: int(ds.Status.DesiredNumberScheduled)}
	byNode := map[string][]NodeState{}
	givenOn := map[string]bool{}
	for _, p := range pods.Items {
		if !metav1.IsControlledBy(&p, ds) {
			continue
		}
		why := cfg.notDone(&p)
		if why == "" {
			givenOn[p.Spec.NodeName] = true
			continue
		}
		byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], NodeState{Node: p.Spec.NodeName, Pod: p.Name, Why: why})
	}
	s.given = len(givenOn)
	for _, node := range sortedKeys(byNode) {
		// A node whose new pod is done and whose old one still stops is not done.
		s.notDone = append(s.notDone, byNode[node]...)
		if givenOn[node] {
			s.given--
		}
	}
	return s, nil
}

// notDone says why a pod has not given its node back yet ("" when it has).
func (cfg Config) notDone(p *corev1.Pod) string {
	i := slices.IndexFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == cfg.Container })
	if i < 0 {
		return "no container " + cfg.Container
	}
	if !slices.Equal(p.Spec.Containers[i].Command, cfg.Command) {
		if p.DeletionTimestamp != nil {
			return "imagepind in its normal mode, stopping"
		}
		return "imagepind in its normal mode, not replaced yet"
	}
	if p.DeletionTimestamp != nil {
		return "stopping"
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return ""
		}
	}
	for _, st := range p.Status.ContainerStatuses {
		if st.Name != cfg.Container {
			continue
		}
		switch {
		case st.State.Waiting != nil:
			return strings.TrimSuffix("not started: "+st.State.Waiting.Reason+": "+st.State.Waiting.Message, ": ")
		case st.State.Terminated != nil:
			return fmt.Sprintf("exited %d: %s", st.State.Terminated.ExitCode, st.State.Terminated.Reason)
		case st.State.Running != nil:
			return "running, the node not given back yet (its readiness: " + strings.Join(cfg.Ready, " ") + ")"
		}
	}
	if p.Status.Phase == corev1.PodPending {
		return "pending"
	}
	return "not ready"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
