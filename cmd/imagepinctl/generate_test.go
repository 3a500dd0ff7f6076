package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	godigest "github.com/opencontainers/go-digest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/resolve"
)

func genDigest(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }

func genPod(name, image, imageID string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: map[string]string{"app": "web"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "c", ImageID: imageID}}},
	}
}

// tagTable answers tags from a table.
type tagTable map[string]string

func (t tagTable) ResolveTag(_ context.Context, image string) (registry.Tag, error) {
	d, ok := t[image]
	if !ok {
		return registry.Tag{}, os.ErrNotExist
	}
	return registry.Tag{Digest: godigest.Digest(d)}, nil
}

func genOptions(t *testing.T, args ...string) *generateOptions {
	t.Helper()
	cmd := newGenerate(&globals{})
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatal(err)
	}
	o := &generateOptions{}
	// The flags' values, as RunE sees them.
	f := cmd.Flags()
	o.selector, _ = f.GetString("selector")
	o.deployments, _ = f.GetStringArray("deployment")
	o.file, _ = f.GetString("file")
	o.output = &outputFlag{value: f.Lookup("output").Value.String(), allowed: []string{outYAML, outJSON}}
	return o
}

func TestGenerateFromPods(t *testing.T) {
	cs := fake.NewClientset(
		genPod("web-1", "quay.io/shop/web:v2", "quay.io/shop/web@"+genDigest('a')),
		genPod("web-2", "quay.io/shop/web:v2", "quay.io/shop/web@"+genDigest('a')),
		genPod("built", "localhost/dev:1", genDigest('f')),
	)
	var out, errb bytes.Buffer
	sel, _ := metav1.ParseToLabelSelector("node-role.kubernetes.io/worker=")
	err := generate(t.Context(), cs, nil, genOptions(t, "-l", "app=web"), "web", "shop", sel, &out, &errb)
	if err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	if !strings.Contains(out.String(), "- name: quay.io/shop/web@"+genDigest('a')+" # tag: quay.io/shop/web:v2\n") {
		t.Errorf("set:\n%s", out.String())
	}
	for _, want := range []string{"left out: pod shop/built container c: localhost/dev:1: the runtime reports a local image ID",
		"1 images from the 3 pods of namespace shop selected by app=web; containers left out: 1"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errb.String())
		}
	}
	if _, err := pinset.ParseSetFile("out", out.Bytes()); err != nil {
		t.Error(err)
	}

	// Nothing pinnable: exit 1, nothing written.
	out.Reset()
	err = generate(t.Context(), fake.NewClientset(genPod("built", "localhost/dev:1", genDigest('f'))), nil, genOptions(t), "web", "shop", sel, &out, &errb)
	if code := exitCode(err); code != exitNo || out.Len() != 0 {
		t.Errorf("nothing to pin: exit %d, output %q", code, out.String())
	}
}

func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	if ee, ok := err.(*exitError); ok {
		return ee.code
	}
	return -1
}

func TestGenerateFromDeploymentToFileAsJSON(t *testing.T) {
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"}}
	dep.Spec.Template.Spec.Containers = []corev1.Container{{Name: "web", Image: "quay.io/shop/web:v3"}}
	cs := fake.NewClientset(dep)
	res := resolve.NewResolver(tagTable{"quay.io/shop/web:v3": genDigest('b')}, 2)
	file := filepath.Join(t.TempDir(), "web.json")
	var out, errb bytes.Buffer
	err := generate(t.Context(), cs, res, genOptions(t, "--deployment", "web", "--file", file, "-o", "json"), "web-v3", "shop", nil, &out, &errb)
	if err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Spec struct {
			PinnedImages []struct{ Name string } `json:"pinnedImages"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(b, &doc); err != nil || len(doc.Spec.PinnedImages) != 1 || doc.Spec.PinnedImages[0].Name != "quay.io/shop/web@"+genDigest('b') {
		t.Fatalf("%v: %s", err, b)
	}
	if out.Len() != 0 {
		t.Errorf("stdout with --file: %q", out.String())
	}

	// A tag the registry does not know: exit 1, naming the container, nothing written.
	dep.Spec.Template.Spec.Containers[0].Image = "quay.io/shop/web:gone"
	cs = fake.NewClientset(dep)
	errb.Reset()
	err = generate(t.Context(), cs, resolve.NewResolver(tagTable{}, 2), genOptions(t, "--deployment", "web"), "web", "shop", nil, &out, &errb)
	if exitCode(err) != exitNo || !strings.Contains(errb.String(), "deployment shop/web container web: quay.io/shop/web:gone: cannot resolve") || out.Len() != 0 {
		t.Errorf("unresolvable: %v\n%s", err, errb.String())
	}
	// A Deployment that does not exist: exit 1.
	err = generate(t.Context(), cs, res, genOptions(t, "--deployment", "nope"), "web", "shop", nil, &out, &errb)
	if exitCode(err) != exitNo || !strings.Contains(err.Error(), "deployment shop/nope") {
		t.Errorf("missing deployment: %v", err)
	}
}

func TestGenerateUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"generate"}, "want the set's NAME"},
		{[]string{"generate", "web", "--deployment", "web", "-l", "app=web"}, "--selector selects pods"},
		{[]string{"generate", "web", "--deployment", "web", "-A"}, "workloads are named in one --namespace"},
		{[]string{"generate", "web", "-A", "-n", "shop"}, "--all-namespaces and --namespace"},
		{[]string{"generate", "web", "--node-selector", "a in (b"}, "--node-selector"},
		{[]string{"generate", "web", "-o", "table"}, "--output table"},
		{[]string{"generate", "web", "--kubeconfig", "/nonexistent/kubeconfig"}, "kubeconfig"},
	} {
		var out, errb bytes.Buffer
		if code := run(t.Context(), tc.args, &out, &errb); code != exitUsage || !strings.Contains(errb.String(), tc.says) {
			t.Errorf("%v: exit %d, want %d saying %q\n%s", tc.args, code, exitUsage, tc.says, errb.String())
		}
	}
}
