//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	appsv1 "k8s.io/api/apps/v1"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/imagepin/imagepin/api/v1alpha1"
	"github.com/imagepin/imagepin/test/env"
)

// TestGenerateSetsFromWhatRuns makes sets with the real imagepinctl from pods and a
// Deployment on a real kube-apiserver, with the least rights it documents (a Role that
// lists pods and gets Deployments), the Deployment's tags resolved in a private registry
// with the node's pull secret; each set validates and is accepted by the API (the CRD's
// schema) as written.
func TestGenerateSetsFromWhatRuns(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "registry"), 0o755)
	reg, err := env.StartAuthRegistry(filepath.Join(dir, "registry"), "puller", "e2e-s3cret")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Stop)
	w := worldOn(t, dir, reg, reg.Host) // CRI-O's registry configuration, not CRI-O: nothing runs images here
	w.writeConfig(worldOptions{})
	secret := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, reg.Host, reg.Auth())
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}

	// v1 runs; v2 is what the Deployment's next rollout creates; the sidecar is by digest.
	pushTagged := func(repo, tag string) env.Image {
		img, err := reg.PushRandom(ctx, repo, 1, 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		auth := remote.WithAuth(&authn.Basic{Username: reg.User, Password: reg.Password})
		dref, err := name.NewDigest(img.Ref(), name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		desc, err := remote.Get(dref, auth, remote.WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		tref, err := name.NewTag(img.Repo+":"+tag, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Tag(tref, desc, auth, remote.WithContext(ctx)); err != nil {
			t.Fatal(err)
		}
		return img
	}
	webV1, webV2 := pushTagged("shop/web", "v1"), pushTagged("shop/web", "v2")
	side := pushTagged("shop/side", "1.0")
	migrate := pushTagged("shop/migrate", "v2")
	db := pushTagged("shop/db", "16")

	kdir := filepath.Join(dir, "kube")
	os.MkdirAll(kdir, 0o755)
	k, err := env.StartKube(kdir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-apiserver log:\n%s", k.LogTail("kube-apiserver", 20))
		}
		k.Stop()
	})
	cs := kubernetes.NewForConfigOrDie(k.AdminConfig())
	dyn := dynamic.NewForConfigOrDie(k.AdminConfig())
	crd, err := v1alpha1.CRD()
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Create(ctx, dyn, crd); err != nil {
		t.Fatal(err)
	}
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}))
	// No controller-manager here: the service accounts the pods and the user need, by hand.
	for _, sa := range []string{"default", "pinner"} {
		must(cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}))
	}

	// The pods, their status written as a kubelet would (no kubelet needed to read it).
	type ctr struct{ name, image, imageID string }
	runPod := func(podName string, labels map[string]string, init ctr, ctrs ...ctr) {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: podName, Labels: labels},
			Spec: corev1.PodSpec{NodeName: "node-a"}}
		status := func(c ctr) corev1.ContainerStatus {
			return corev1.ContainerStatus{Name: c.name, Image: c.image, ImageID: c.imageID, Ready: true,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}
		}
		if init.name != "" {
			p.Spec.InitContainers = []corev1.Container{{Name: init.name, Image: init.image}}
		}
		for _, c := range ctrs {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c.name, Image: c.image})
		}
		p, err := cs.CoreV1().Pods("shop").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.Phase = corev1.PodRunning
		if init.name != "" {
			s := status(init)
			s.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed", StartedAt: metav1.Now(), FinishedAt: metav1.Now()}}
			s.Ready = false
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{s}
		}
		for _, c := range ctrs {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, status(c))
		}
		must(cs.CoreV1().Pods("shop").UpdateStatus(ctx, p, metav1.UpdateOptions{}))
	}
	web := map[string]string{"app": "web"}
	for _, n := range []string{"web-1", "web-2"} {
		runPod(n, web, ctr{"migrate", migrate.Repo + ":v2", migrate.Ref()},
			ctr{"web", webV1.Repo + ":v1", webV1.Ref()}, ctr{"side", side.Ref(), side.Ref()})
	}
	// Built on the node: the runtime knows only its local ID.
	localID := "sha256:" + strings.Repeat("5", 64)
	runPod("web-dev", web, ctr{}, ctr{"web", "localhost/web:dev", localID})
	runPod("db-0", map[string]string{"app": "db"}, ctr{}, ctr{"db", db.Repo + ":16", db.Ref()})

	// The Deployment's template names v2 by tag: not running anywhere yet.
	replicas := int32(3)
	must(cs.AppsV1().Deployments("shop").Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: web},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: web}, Spec: corev1.PodSpec{
				InitContainers: []corev1.Container{{Name: "migrate", Image: migrate.Repo + ":v2"}},
				Containers:     []corev1.Container{{Name: "web", Image: webV2.Repo + ":v2"}, {Name: "side", Image: side.Repo + ":1.0"}},
			}}},
	}, metav1.CreateOptions{}))

	// The user: a Role that lists pods and gets Deployments in the namespace, no more.
	must(cs.RbacV1().Roles("shop").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "imagepin-set-maker"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}},
			{APIGroups: []string{"apps"}, Resources: []string{"deployments", "daemonsets", "statefulsets"}, Verbs: []string{"get"}},
		}}, metav1.CreateOptions{}))
	must(cs.RbacV1().RoleBindings("shop").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "pinner"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "imagepin-set-maker"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "shop", Name: "pinner"}}}, metav1.CreateOptions{}))
	tok, err := cs.CoreV1().ServiceAccounts("shop").CreateToken(ctx, "pinner",
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(kdir, "pinner.kubeconfig")
	if err := k.TokenKubeconfig(kubeconfig, tok.Status.Token); err != nil {
		t.Fatal(err)
	}

	ctl := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		if args[0] == "generate" {
			args = append(args, "--kubeconfig", kubeconfig, "--config", w.config)
		}
		cmd := exec.Command(filepath.Join(binDir, "imagepinctl"), args...)
		var o, e strings.Builder
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		code = 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		t.Logf("imagepinctl %s: exit %d\n%s", strings.Join(args, " "), code, e.String())
		return o.String(), e.String(), code
	}
	// applied creates the set through the API (the CRD's schema checks it) and returns
	// the images the API holds.
	applied := func(file string) []string {
		t.Helper()
		if _, _, code := ctl("validate", file); code != 0 {
			t.Fatalf("imagepinctl validate %s: exit %d", file, code)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if err := env.ApplyYAML(ctx, dyn, b); err != nil {
			t.Fatalf("create %s through the API: %v", file, err)
		}
		var setName string
		for _, l := range strings.Split(string(b), "\n") {
			if s, ok := strings.CutPrefix(l, "  name: "); ok {
				setName = s
				break
			}
		}
		u, err := dyn.Resource(v1alpha1.GroupVersionResource).Get(ctx, setName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		items, _, err := unstructured.NestedSlice(u.Object, "spec", "pinnedImages")
		if err != nil {
			t.Fatal(err)
		}
		var refs []string
		for _, it := range items {
			ref, _, _ := unstructured.NestedString(it.(map[string]any), "name")
			refs = append(refs, ref)
		}
		return refs
	}
	sorted := func(refs ...string) []string { slices.Sort(refs); return refs }

	// 1. From the pods the app runs.
	runsFile := filepath.Join(dir, "web-runs.yaml")
	_, stderr, code := ctl("generate", "web-runs", "-n", "shop", "-l", "app=web", "--node-selector", "node-role.kubernetes.io/worker=", "--file", runsFile)
	if code != 0 {
		t.Fatalf("generate from pods: exit %d", code)
	}
	if !strings.Contains(stderr, "left out: pod shop/web-dev container web: localhost/web:dev: the runtime reports a local image ID") ||
		!strings.Contains(stderr, "push it to a registry") {
		t.Errorf("the local image is not reported with its fix:\n%s", stderr)
	}
	text, _ := os.ReadFile(runsFile)
	if !strings.Contains(string(text), webV1.Ref()+" # tag: "+webV1.Repo+":v1") {
		t.Errorf("web v1 without its tag:\n%s", text)
	}
	if got, want := applied(runsFile), sorted(migrate.Ref(), webV1.Ref(), side.Ref()); !slices.Equal(got, want) {
		t.Errorf("set from pods: %v, want %v (not db's, not the local one, each once)", got, want)
	}

	// 2. From the Deployment's next template: v2 through the private registry.
	nextFile := filepath.Join(dir, "web-next.yaml")
	if _, _, code := ctl("generate", "web-next", "-n", "shop", "--deployment", "web", "--file", nextFile); code != 0 {
		t.Fatalf("generate from the deployment: exit %d", code)
	}
	if got, want := applied(nextFile), sorted(migrate.Ref(), webV2.Ref(), side.Ref()); !slices.Equal(got, want) {
		t.Errorf("set from the template: %v, want %v (v2, not the v1 that runs)", got, want)
	}

	// 3. A template whose tag the registry does not have: exit 1, nothing written.
	patch := []byte(`{"spec":{"template":{"spec":{"containers":[{"name":"web","image":"` + webV2.Repo + `:v3"}]}}}}`)
	must(cs.AppsV1().Deployments("shop").Patch(ctx, "web", "application/strategic-merge-patch+json", patch, metav1.PatchOptions{}))
	badFile := filepath.Join(dir, "web-bad.yaml")
	_, stderr, code = ctl("generate", "web-bad", "-n", "shop", "--deployment", "web", "--file", badFile)
	if code != 1 || !strings.Contains(stderr, "deployment shop/web container web: "+webV2.Repo+":v3: cannot resolve") {
		t.Errorf("an unresolvable tag: exit %d\n%s", code, stderr)
	}
	if _, err := os.Stat(badFile); !os.IsNotExist(err) {
		t.Errorf("a set was written for an unresolvable template: %v", err)
	}

	// 4. The Role allows one namespace: every namespace is refused, clearly, exit 2.
	_, stderr, code = ctl("generate", "all", "-A")
	if code != 2 || !strings.Contains(stderr, "forbidden") {
		t.Errorf("-A without the right: exit %d\n%s", code, stderr)
	}
}
