package setgen

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/imagepin/imagepin/resolve"
)

// Workload kinds whose pod template a set can be made from.
const (
	KindDeployment  = "Deployment"
	KindDaemonSet   = "DaemonSet"
	KindStatefulSet = "StatefulSet"
)

// Workload is a workload's pod template: what its next rollout creates.
type Workload struct {
	Kind, Namespace, Name string
	Template              corev1.PodSpec
}

func (w Workload) where(container string) string {
	return fmt.Sprintf("%s %s/%s container %s", strings.ToLower(w.Kind), w.Namespace, w.Name, container)
}

// GetWorkload reads a Deployment's, DaemonSet's or StatefulSet's spec.template: the
// template its next rollout creates pods from, not the pods that run now.
func GetWorkload(ctx context.Context, cs kubernetes.Interface, kind, namespace, name string) (Workload, error) {
	w := Workload{Kind: kind, Namespace: namespace, Name: name}
	var err error
	switch kind {
	case KindDeployment:
		dep, e := cs.AppsV1().Deployments(namespace).Get(ctx, name, metav1.GetOptions{})
		if e == nil {
			w.Template = dep.Spec.Template.Spec
		}
		err = e
	case KindDaemonSet:
		ds, e := cs.AppsV1().DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
		if e == nil {
			w.Template = ds.Spec.Template.Spec
		}
		err = e
	case KindStatefulSet:
		ss, e := cs.AppsV1().StatefulSets(namespace).Get(ctx, name, metav1.GetOptions{})
		if e == nil {
			w.Template = ss.Spec.Template.Spec
		}
		err = e
	default:
		return w, fmt.Errorf("kind %q: want %s, %s or %s", kind, KindDeployment, KindDaemonSet, KindStatefulSet)
	}
	if err != nil {
		return w, fmt.Errorf("get %s %s/%s: %w", strings.ToLower(kind), namespace, name, err)
	}
	return w, nil
}

// Resolver turns a reference into repository@sha256:… through the registry, as the
// node would pull it: *resolve.Resolver.
type Resolver interface {
	Resolve(ctx context.Context, image string) (resolve.Result, error)
}

// FromTemplates is the images of workloads' pod templates (init and regular
// containers), tags resolved to digests. A reference that cannot be resolved is an
// error naming the workload and container: the set would miss what the rollout needs.
func FromTemplates(ctx context.Context, r Resolver, workloads []Workload) (Result, error) {
	type use struct {
		where, image string
	}
	var uses []use
	for _, w := range workloads {
		for _, list := range [][]corev1.Container{w.Template.InitContainers, w.Template.Containers} {
			for _, ct := range list {
				uses = append(uses, use{w.where(ct.Name), ct.Image})
			}
		}
	}

	// Each distinct image once, concurrently (the resolver bounds how many at once).
	results := map[string]resolve.Result{}
	errs := map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, u := range uses {
		mu.Lock()
		_, claimed := results[u.image]
		if !claimed { // a result written already must not be reset
			results[u.image] = resolve.Result{}
		}
		mu.Unlock()
		if claimed {
			continue
		}
		wg.Add(1)
		go func(img string) {
			defer wg.Done()
			res, err := r.Resolve(ctx, img)
			mu.Lock()
			defer mu.Unlock()
			results[img], errs[img] = res, err
		}(u.image)
	}
	wg.Wait()

	c := newCollector()
	var failed []error
	for _, u := range uses {
		if err := errs[u.image]; err != nil {
			failed = append(failed, fmt.Errorf("%s: %s: cannot resolve: %w", u.where, u.image, err))
			continue
		}
		s, err := parseSpec(u.image)
		if err != nil {
			failed = append(failed, fmt.Errorf("%s: %s: %w", u.where, u.image, err))
			continue
		}
		repo, dgst, err := splitDigestRef(results[u.image].To)
		if err != nil {
			failed = append(failed, fmt.Errorf("%s: %s: %w", u.where, u.image, err))
			continue
		}
		c.add(repo, dgst, s.tag, u.where)
	}
	if len(failed) > 0 {
		return Result{}, errors.Join(failed...)
	}
	return c.result(), nil
}

func splitDigestRef(ref string) (reference.Named, digest.Digest, error) {
	named, err := reference.ParseNamed(ref)
	if err != nil {
		return nil, "", fmt.Errorf("resolved to %q: %w", ref, err)
	}
	c, ok := named.(reference.Canonical)
	if !ok {
		return nil, "", fmt.Errorf("resolved to %q, which has no digest", ref)
	}
	if err := checkDigest(c.Digest()); err != nil {
		return nil, "", err
	}
	return reference.TrimNamed(c), c.Digest(), nil
}
