package setgen

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/resolve"
)

func dg(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }

func pod(ns, name string, labels map[string]string, spec []corev1.Container, statuses ...corev1.ContainerStatus) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:       corev1.PodSpec{Containers: spec},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: statuses},
	}
}

func ctr(name, image string) corev1.Container { return corev1.Container{Name: name, Image: image} }

func st(name, imageID string) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, ImageID: imageID}
}

func TestFromPods(t *testing.T) {
	web := pod("shop", "web-1", nil,
		[]corev1.Container{ctr("web", "quay.io/shop/web:v2"), ctr("side", "quay.io/shop/side@"+dg('b'))},
		st("web", "quay.io/shop/web@"+dg('a')), st("side", "quay.io/shop/side@"+dg('b')))
	web.Spec.InitContainers = []corev1.Container{ctr("init", "docker.io/library/busybox:1.36")}
	web.Status.InitContainerStatuses = []corev1.ContainerStatus{st("init", "docker-pullable://busybox@"+dg('c'))}
	web.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: "quay.io/tools/debug:1"}}}
	web.Status.EphemeralContainerStatuses = []corev1.ContainerStatus{st("debug", "quay.io/tools/debug@"+dg('d'))}
	// Same image, another tag, another pod: one entry, both tags.
	web2 := pod("shop", "web-2", nil, []corev1.Container{ctr("web", "quay.io/shop/web:stable")}, st("web", "quay.io/shop/web@"+dg('a')))
	local := pod("shop", "built", nil, []corev1.Container{ctr("app", "localhost/app:dev")}, st("app", dg('e')))
	pending := pod("shop", "new", nil, []corev1.Container{ctr("app", "quay.io/shop/app:v3")})
	pending.Status.Phase = corev1.PodPending
	pulling := pod("shop", "pulling", nil, []corev1.Container{ctr("app", "quay.io/shop/app:v4")},
		corev1.ContainerStatus{Name: "app", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}}})

	r := FromPods([]corev1.Pod{*web, *web2, *local, *pending, *pulling})
	want := []Image{
		{Ref: "docker.io/library/busybox@" + dg('c'), Tags: []string{"docker.io/library/busybox:1.36"}, From: []string{"pod shop/web-1 container init"}},
		{Ref: "quay.io/shop/side@" + dg('b'), From: []string{"pod shop/web-1 container side"}},
		{Ref: "quay.io/shop/web@" + dg('a'), Tags: []string{"quay.io/shop/web:stable", "quay.io/shop/web:v2"},
			From: []string{"pod shop/web-1 container web", "pod shop/web-2 container web"}},
		{Ref: "quay.io/tools/debug@" + dg('d'), Tags: []string{"quay.io/tools/debug:1"}, From: []string{"pod shop/web-1 container debug"}},
	}
	if !reflect.DeepEqual(r.Images, want) {
		t.Fatalf("images:\n got %+v\nwant %+v", r.Images, want)
	}
	if len(r.Warnings) != 3 {
		t.Fatalf("want 3 warnings (local ID, no status, no image ID), got %v", r.Warnings)
	}
	for i, w := range []struct{ where, has string }{
		{"pod shop/built container app", "local image ID"},
		{"pod shop/new container app", "no container status yet (pod phase Pending)"},
		{"pod shop/pulling container app", "ImagePullBackOff"},
	} {
		got := r.Warnings[i]
		if got.Where != w.where || !strings.Contains(got.Reason, w.has) {
			t.Errorf("warning %d: %s, want %s: …%s…", i, got, w.where, w.has)
		}
	}
	if !strings.Contains(r.Warnings[0].Reason, "push it to a registry") {
		t.Errorf("the local-ID warning says no fix: %s", r.Warnings[0])
	}
}

func TestFromPodsRepository(t *testing.T) {
	for _, tc := range []struct {
		name, spec, imageID, want string
		note                      bool
	}{
		// The pod names a fully qualified repository: the kubelet pulls that name.
		{"qualified, runtime reports a mirror", "registry.example/app:v1", "mirror.example/app@" + dg('a'), "registry.example/app@" + dg('a'), true},
		// A short name went through search registries: the runtime's repository says where.
		{"short name", "app:v1", "quay.io/ns/app@" + dg('a'), "quay.io/ns/app@" + dg('a'), false},
		{"short Docker Hub name, Docker's imageID", "nginx", "docker-pullable://nginx@" + dg('a'), "docker.io/library/nginx@" + dg('a'), false},
		{"same repository", "quay.io/ns/app@" + dg('a'), "quay.io/ns/app@" + dg('a'), "quay.io/ns/app@" + dg('a'), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := FromPods([]corev1.Pod{*pod("ns", "p", nil, []corev1.Container{ctr("c", tc.spec)}, st("c", tc.imageID))})
			if len(r.Images) != 1 || r.Images[0].Ref != tc.want {
				t.Fatalf("got %+v (warnings %v), want %s", r.Images, r.Warnings, tc.want)
			}
			if got := len(r.Notes) > 0; got != tc.note {
				t.Errorf("notes %v, want a note: %v", r.Notes, tc.note)
			}
		})
	}
}

func TestParseImageIDRefusesWhatIsNotARegistryDigest(t *testing.T) {
	for _, id := range []string{"", dg('a'), strings.Repeat("a", 64), "docker://" + dg('a'), "quay.io/x/y:1", "quay.io/x/y@sha512:" + strings.Repeat("a", 128)} {
		if _, err := parseImageID(id); err == nil {
			t.Errorf("%q: accepted", id)
		}
	}
	if _, err := parseImageID(dg('a')); !errors.Is(err, ErrNoRegistryDigest) {
		t.Errorf("a local ID: %v, want ErrNoRegistryDigest", err)
	}
}

func TestListPodsBySelectorAndNamespace(t *testing.T) {
	cs := fake.NewClientset(
		pod("shop", "web-1", map[string]string{"app": "web"}, nil),
		pod("shop", "db-1", map[string]string{"app": "db"}, nil),
		pod("other", "web-1", map[string]string{"app": "web"}, nil),
	)
	names := func(pods []corev1.Pod) []string {
		var out []string
		for _, p := range pods {
			out = append(out, p.Namespace+"/"+p.Name)
		}
		return out
	}
	for _, tc := range []struct {
		ns, sel string
		want    []string
	}{
		{"shop", "app=web", []string{"shop/web-1"}},
		{"shop", "", []string{"shop/db-1", "shop/web-1"}},
		{"", "app=web", []string{"other/web-1", "shop/web-1"}},
	} {
		pods, err := ListPods(t.Context(), cs, tc.ns, tc.sel)
		if err != nil {
			t.Fatal(err)
		}
		if got := names(pods); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ns %q sel %q: %v, want %v", tc.ns, tc.sel, got, tc.want)
		}
	}
}

// fakeResolver answers from a table of tags; a reference by digest is kept.
type fakeResolver struct {
	tags  map[string]string // image → digest
	mu    sync.Mutex
	calls map[string]int
}

func (f *fakeResolver) Resolve(_ context.Context, image string) (resolve.Result, error) {
	f.mu.Lock()
	f.calls[image]++
	f.mu.Unlock()
	if i := strings.Index(image, "@"); i > 0 {
		repo := image[:i]
		if j := strings.LastIndex(repo, ":"); j > strings.LastIndex(repo, "/") {
			repo = repo[:j]
		}
		return resolve.Result{From: image, To: repo + image[i:]}, nil
	}
	d, ok := f.tags[image]
	if !ok {
		return resolve.Result{From: image}, fmt.Errorf("manifest unknown")
	}
	return resolve.Result{From: image, To: image[:strings.LastIndex(image, ":")] + "@" + d}, nil
}

func deployment(ns, name string, images ...string) *appsv1.Deployment {
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	d.Spec.Template.Spec.InitContainers = []corev1.Container{ctr("init", images[0])}
	for i, img := range images[1:] {
		d.Spec.Template.Spec.Containers = append(d.Spec.Template.Spec.Containers, ctr(fmt.Sprintf("c%d", i), img))
	}
	return d
}

func TestFromTemplates(t *testing.T) {
	cs := fake.NewClientset(
		deployment("shop", "web", "quay.io/shop/migrate:v2", "quay.io/shop/web:v2", "quay.io/shop/side:1.0@"+dg('c')),
		&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "agent"},
			Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{ctr("a", "quay.io/shop/web:v2")}}}}},
		&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db"},
			Spec: appsv1.StatefulSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{ctr("db", "quay.io/shop/db@"+dg('d'))}}}}},
	)
	var ws []Workload
	for _, k := range [][2]string{{KindDeployment, "web"}, {KindDaemonSet, "agent"}, {KindStatefulSet, "db"}} {
		w, err := GetWorkload(t.Context(), cs, k[0], "shop", k[1])
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	res := &fakeResolver{tags: map[string]string{"quay.io/shop/migrate:v2": dg('a'), "quay.io/shop/web:v2": dg('b')}, calls: map[string]int{}}
	r, err := FromTemplates(t.Context(), res, ws)
	if err != nil {
		t.Fatal(err)
	}
	want := []Image{
		{Ref: "quay.io/shop/db@" + dg('d'), From: []string{"statefulset shop/db container db"}},
		{Ref: "quay.io/shop/migrate@" + dg('a'), Tags: []string{"quay.io/shop/migrate:v2"}, From: []string{"deployment shop/web container init"}},
		{Ref: "quay.io/shop/side@" + dg('c'), Tags: []string{"quay.io/shop/side:1.0"}, From: []string{"deployment shop/web container c1"}},
		{Ref: "quay.io/shop/web@" + dg('b'), Tags: []string{"quay.io/shop/web:v2"}, From: []string{"daemonset shop/agent container a", "deployment shop/web container c0"}},
	}
	if !reflect.DeepEqual(r.Images, want) {
		t.Fatalf("images:\n got %+v\nwant %+v", r.Images, want)
	}
	if res.calls["quay.io/shop/web:v2"] != 1 {
		t.Errorf("web:v2 looked up %d times, want once", res.calls["quay.io/shop/web:v2"])
	}
}

func TestFromTemplatesUnresolvableNamesTheContainer(t *testing.T) {
	w := Workload{Kind: KindDeployment, Namespace: "shop", Name: "web",
		Template: corev1.PodSpec{Containers: []corev1.Container{ctr("web", "quay.io/shop/web:gone"), ctr("ok", "quay.io/shop/ok@"+dg('a'))}}}
	_, err := FromTemplates(t.Context(), &fakeResolver{calls: map[string]int{}}, []Workload{w})
	if err == nil || !strings.Contains(err.Error(), "deployment shop/web container web: quay.io/shop/web:gone: cannot resolve: manifest unknown") {
		t.Fatalf("err = %v", err)
	}
}

func TestGetWorkloadErrors(t *testing.T) {
	cs := fake.NewClientset()
	if _, err := GetWorkload(t.Context(), cs, KindDeployment, "shop", "missing"); err == nil || !strings.Contains(err.Error(), "deployment shop/missing") {
		t.Errorf("missing deployment: %v", err)
	}
	if _, err := GetWorkload(t.Context(), cs, "Job", "shop", "x"); err == nil {
		t.Error("kind Job accepted")
	}
}

func TestDocument(t *testing.T) {
	r := Result{Images: []Image{
		{Ref: "quay.io/shop/db@" + dg('d')},
		{Ref: "quay.io/shop/web@" + dg('b'), Tags: []string{"quay.io/shop/web:stable", "quay.io/shop/web:v2"}},
	}}
	sel, _ := metav1.ParseToLabelSelector("node-role.kubernetes.io/worker=")
	out, err := Document("shop", sel, r, []string{"from pods in namespace shop"})
	if err != nil {
		t.Fatal(err)
	}
	text := string(out)
	for _, want := range []string{
		"# from pods in namespace shop\n",
		"- name: quay.io/shop/web:stable@" + dg('b') + "\n",
		"- name: quay.io/shop/web:v2@" + dg('b') + "\n",
		"- name: quay.io/shop/db@" + dg('d') + "\n",
		"node-role.kubernetes.io/worker: \"\"",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("document lacks %q:\n%s", want, text)
		}
	}
	p, err := pinset.ParseSetFile("x", out)
	if err != nil {
		t.Fatal(err)
	}
	s := p.Sets[0]
	if s.Name != "shop" || !reflect.DeepEqual(s.Images, r.Refs()) || !s.Selector.Matches(map[string]string{"node-role.kubernetes.io/worker": ""}) ||
		s.Selector.Matches(map[string]string{}) {
		t.Errorf("parsed %+v", s)
	}

	if _, err := Document("shop", nil, Result{}, nil); err == nil {
		t.Error("an empty set was written")
	}
	if _, err := Document("Not_A_Name", nil, r, nil); err == nil {
		t.Error("an invalid name was written")
	}
	all, err := Document("all", nil, r, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(all), "nodeSelector: {}") {
		t.Errorf("no selector: want {} (every node):\n%s", all)
	}
}

// An image two containers name is resolved once, and both uses get the result: the
// second use, coming after the first resolution wrote its result (hundreds of other
// images resolved in between), must not reset it.
func TestFromTemplatesOneImageTwoContainersFarApart(t *testing.T) {
	tags := map[string]string{"quay.io/shop/web:v2": dg('b')}
	images := []string{"quay.io/shop/init:1", "quay.io/shop/web:v2"}
	tags["quay.io/shop/init:1"] = dg('a')
	for i := 0; i < 500; i++ {
		img := fmt.Sprintf("quay.io/shop/app-%d:v1", i)
		tags[img] = dg('c')
		images = append(images, img)
	}
	images = append(images, "quay.io/shop/web:v2")
	d := deployment("shop", "web", images...)
	w, err := GetWorkload(t.Context(), fake.NewClientset(d), KindDeployment, "shop", "web")
	if err != nil {
		t.Fatal(err)
	}
	res := &fakeResolver{tags: tags, calls: map[string]int{}}
	r, err := FromTemplates(t.Context(), res, []Workload{w})
	if err != nil {
		t.Fatal(err)
	}
	var web *Image
	for i := range r.Images {
		if r.Images[i].Ref == "quay.io/shop/web@"+dg('b') {
			web = &r.Images[i]
		}
	}
	if web == nil || len(web.From) != 2 {
		t.Fatalf("web:v2: %+v", web)
	}
	if n := res.calls["quay.io/shop/web:v2"]; n != 1 {
		t.Errorf("resolved %d times", n)
	}
}
