package giveback

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// unmarkNodes removes imagepin's condition from every Node's status and its startup
// taint from every Node's taints, each with a JSON patch that tests what it removes (a
// Node changed meanwhile is read again). It returns how many of each it removed; a Node
// it could not change is named in the error, and the others are still done.
func unmarkNodes(ctx context.Context, cs kubernetes.Interface, cfg Config, log logrus.FieldLogger) (conditions, taints int, err error) {
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, fmt.Errorf("list Nodes: %w", err)
	}
	var errs []error
	for i := range nodes.Items {
		n := &nodes.Items[i]
		c, t, err := unmark(ctx, cs, n, cfg)
		conditions, taints = conditions+c, taints+t
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if c+t > 0 {
			log.WithField("node", n.Name).WithField("condition", c > 0).WithField("taint", t > 0).Info("imagepin's marks removed from the Node")
		}
	}
	return conditions, taints, errors.Join(errs...)
}

// unmark removes the condition and the taint from one Node, reading it again when a
// patch fails (a test that no longer holds: the kubelet updates its status often); a
// Node deleted meanwhile has nothing left to remove.
func unmark(ctx context.Context, cs kubernetes.Interface, n *corev1.Node, cfg Config) (conditions, taints int, err error) {
	name := n.Name
	for try := 1; ; try++ {
		c, t, err := unmarkOnce(ctx, cs, n, cfg)
		conditions, taints = conditions+c, taints+t
		if err == nil || apierrors.IsNotFound(err) {
			return conditions, taints, nil
		}
		if try == 5 || ctx.Err() != nil {
			return conditions, taints, err
		}
		if n, err = cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return conditions, taints, nil
		} else if err != nil {
			return conditions, taints, fmt.Errorf("get Node %s: %w", name, err)
		}
	}
}

func unmarkOnce(ctx context.Context, cs kubernetes.Interface, n *corev1.Node, cfg Config) (conditions, taints int, err error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// From the last to the first, so that each index stays right.
	var ops []map[string]any
	for i := len(n.Status.Conditions) - 1; i >= 0; i-- {
		c := n.Status.Conditions[i]
		if string(c.Type) == cfg.Condition {
			path := fmt.Sprintf("/status/conditions/%d", i)
			ops = append(ops, map[string]any{"op": "test", "path": path + "/type", "value": c.Type}, map[string]any{"op": "remove", "path": path})
		}
	}
	if len(ops) > 0 {
		if err := patch(ctx, cs, n.Name, ops, "status"); err != nil {
			return 0, 0, fmt.Errorf("remove condition %s from Node %s: %w", cfg.Condition, n.Name, err)
		}
		conditions = len(ops) / 2
	}
	ops = nil
	for i := len(n.Spec.Taints) - 1; i >= 0 && cfg.StartupTaint != ""; i-- {
		t := n.Spec.Taints[i]
		if t.Key == cfg.StartupTaint {
			path := fmt.Sprintf("/spec/taints/%d", i)
			ops = append(ops, map[string]any{"op": "test", "path": path, "value": t}, map[string]any{"op": "remove", "path": path})
		}
	}
	if len(ops) > 0 {
		if err := patch(ctx, cs, n.Name, ops, ""); err != nil {
			return conditions, 0, fmt.Errorf("remove taint %s from Node %s: %w", cfg.StartupTaint, n.Name, err)
		}
		taints = len(ops) / 2
	}
	return conditions, taints, nil
}

func patch(ctx context.Context, cs kubernetes.Interface, node string, ops []map[string]any, subresource string) error {
	b, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	var sub []string
	if subresource != "" {
		sub = []string{subresource}
	}
	_, err = cs.CoreV1().Nodes().Patch(ctx, node, types.JSONPatchType, b, metav1.PatchOptions{FieldManager: FieldManager}, sub...)
	return err
}
