package setgen

import (
	"context"
	"errors"
	"fmt"

	"github.com/distribution/reference"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// listPageSize bounds one List answer; larger clusters are read in pages.
const listPageSize = 500

// ListPods lists the pods of namespace ("" every namespace) that selector (a label
// selector as kubectl's -l; "" every pod) selects, page by page.
func ListPods(ctx context.Context, cs kubernetes.Interface, namespace, selector string) ([]corev1.Pod, error) {
	var pods []corev1.Pod
	opts := metav1.ListOptions{LabelSelector: selector, Limit: listPageSize}
	for {
		list, err := cs.CoreV1().Pods(namespace).List(ctx, opts)
		if err != nil {
			where := "every namespace"
			if namespace != "" {
				where = "namespace " + namespace
			}
			return nil, fmt.Errorf("list pods in %s: %w", where, err)
		}
		pods = append(pods, list.Items...)
		if list.Continue == "" {
			return pods, nil
		}
		opts.Continue = list.Continue
	}
}

// FromPods is the images pods run, by the digest in each container status's imageID
// (init, regular and ephemeral containers), with the tag the pod's spec names. A
// container whose runtime reports no registry digest, or that has no status yet, is a
// warning and left out.
func FromPods(pods []corev1.Pod) Result {
	c := newCollector()
	for i := range pods {
		fromPod(c, &pods[i])
	}
	return c.result()
}

func fromPod(c *collector, p *corev1.Pod) {
	specs := map[string]string{} // container name → image in the spec
	var order []string
	for _, ct := range p.Spec.InitContainers {
		specs[ct.Name] = ct.Image
		order = append(order, ct.Name)
	}
	for _, ct := range p.Spec.Containers {
		specs[ct.Name] = ct.Image
		order = append(order, ct.Name)
	}
	for _, ct := range p.Spec.EphemeralContainers {
		specs[ct.Name] = ct.Image
		order = append(order, ct.Name)
	}
	seen := map[string]bool{}
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses, p.Status.EphemeralContainerStatuses} {
		for i := range list {
			seen[list[i].Name] = true
			fromStatus(c, p, specs[list[i].Name], &list[i])
		}
	}
	for _, name := range order {
		if !seen[name] {
			c.warn(where(p, name), specs[name], fmt.Sprintf("no container status yet (pod phase %s): run again once it started", phase(p)))
		}
	}
}

func fromStatus(c *collector, p *corev1.Pod, specImage string, cs *corev1.ContainerStatus) {
	w := where(p, cs.Name)
	shown := specImage
	if shown == "" {
		shown = cs.Image
	}
	id, err := parseImageID(cs.ImageID)
	switch {
	case errors.Is(err, ErrNoRegistryDigest):
		c.warn(w, shown, fmt.Sprintf("%v (%s): the image was built or loaded on the node, not pulled from a registry; "+
			"push it to a registry and run the pod from there, or add its repository@sha256:… to the set by hand", err, cs.ImageID))
		return
	case err != nil:
		reason := err.Error()
		if cs.State.Waiting != nil && cs.State.Waiting.Reason != "" {
			reason += " (waiting: " + cs.State.Waiting.Reason + ")"
		}
		c.warn(w, shown, reason)
		return
	}
	tag := ""
	pinRepo := reference.TrimNamed(id)
	if specImage != "" {
		s, err := parseSpec(specImage)
		if err != nil {
			c.warn(w, specImage, "the pod's image: "+err.Error())
			return
		}
		tag = s.tag
		// The kubelet pulls the name the pod gives: pin under it when it is fully
		// qualified (a short name goes through the node's search registries; the
		// runtime's repository then says where it went).
		if s.qualified && s.repo.Name() != pinRepo.Name() {
			c.note(w, specImage, fmt.Sprintf("the runtime reports %s; pinned under the pod's repository %s with the same digest", cs.ImageID, s.repo.Name()))
			pinRepo = s.repo
		}
	}
	c.add(pinRepo, id.Digest(), tag, w)
}

func where(p *corev1.Pod, container string) string {
	return fmt.Sprintf("pod %s/%s container %s", p.Namespace, p.Name, container)
}

func phase(p *corev1.Pod) string {
	if p.Status.Phase == "" {
		return "unknown"
	}
	return string(p.Status.Phase)
}
