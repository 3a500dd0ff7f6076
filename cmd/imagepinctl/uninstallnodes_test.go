package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/imagepin/imagepin/cluster/giveback"
)

// uninstall-nodes refuses what it cannot run, before it touches the cluster.
func TestUninstallNodesUsage(t *testing.T) {
	ok := `["/imagepind","uninstall","--wait"]`
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"uninstall-nodes", "--ready", ok}, `required flag(s) "command" not set`},
		{[]string{"uninstall-nodes", "--command", "/imagepind uninstall", "--ready", ok}, "--command \"/imagepind uninstall\": want a JSON list"},
		{[]string{"uninstall-nodes", "--command", ok, "--ready", "[]"}, "--ready \"[]\": want a JSON list"},
		{[]string{"uninstall-nodes", "--command", ok, "--ready", ok, "--timeout", "0s"}, "--timeout 0s: must be positive"},
	} {
		code, _, errOut := ctl(t, c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%q: exit %d, stderr %q, want %q", c.args, code, errOut, c.want)
		}
	}
}

// Nodes not given back exit 1, naming them; every node given back exits 0 with counts.
func TestUninstallNodesExitCodes(t *testing.T) {
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	yes := true
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "imagepind", Namespace: "imagepin", UID: "u"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "imagepind"}},
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "imagepind", Command: []string{"/imagepind"}}}}}},
		Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: 1}}
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "imagepind-x", Namespace: "imagepin", Labels: map[string]string{"app": "imagepind"},
		OwnerReferences: []metav1.OwnerReference{{UID: "u", Controller: &yes}}},
		Spec: corev1.PodSpec{NodeName: "worker-1", Containers: []corev1.Container{{Name: "imagepind", Command: []string{"/imagepind"}}}}}
	cfg := giveback.Config{Namespace: "imagepin", DaemonSet: "imagepind", Container: "imagepind",
		Command: []string{"/imagepind", "uninstall", "--wait"}, Ready: []string{"/imagepind", "uninstall", "--status"},
		Condition: "PinnedImagesReady", Timeout: 50 * time.Millisecond, Poll: 10 * time.Millisecond, Log: quiet}
	run := func(cs *fake.Clientset) (int, string, string) {
		root := newRoot(&bytes.Buffer{}, &bytes.Buffer{})
		var out, errb bytes.Buffer
		cmd := &cobra.Command{RunE: func(cmd *cobra.Command, _ []string) error { return uninstallNodes(cmd, cs, cfg) }}
		root.AddCommand(cmd)
		cmd.SetOut(&out)
		cmd.SetErr(&errb)
		cmd.SetContext(context.Background())
		err := cmd.RunE(cmd, nil)
		if err == nil {
			return 0, out.String(), errb.String()
		}
		return err.(*exitError).code, out.String(), err.Error()
	}
	code, _, msg := run(fake.NewClientset(ds, old))
	if code != exitNo || !strings.Contains(msg, "worker-1 (pod imagepind-x: imagepind in its normal mode") {
		t.Errorf("a node not given back: exit %d, %q", code, msg)
	}
	code, out, msg := run(fake.NewClientset())
	if code != 0 || out != "0 nodes given back; condition PinnedImagesReady removed from 0 Nodes, taint  from 0\n" {
		t.Errorf("nothing to give back: exit %d, %q %q", code, out, msg)
	}
}
