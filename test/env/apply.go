package env

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/imagepin/imagepin/api/v1alpha1"
)

// resources are the kinds the tests and benchmarks create.
var resources = map[string]schema.GroupVersionResource{
	"CustomResourceDefinition": {Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"},
	"Namespace":                {Version: "v1", Resource: "namespaces"},
	"ServiceAccount":           {Version: "v1", Resource: "serviceaccounts"},
	"Node":                     {Version: "v1", Resource: "nodes"},
	"ClusterRole":              {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"},
	"ClusterRoleBinding":       {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"},
	"Role":                     {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"},
	"RoleBinding":              {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"},
	v1alpha1.Kind:              v1alpha1.GroupVersionResource,
}

// Resource is the resource of a kind Create knows.
func Resource(kind string) schema.GroupVersionResource { return resources[kind] }

// Create creates an object, as `kubectl create` would; one that exists already is fine.
func Create(ctx context.Context, dyn dynamic.Interface, u *unstructured.Unstructured) error {
	gvr, ok := resources[u.GetKind()]
	if !ok {
		return fmt.Errorf("no resource for kind %s", u.GetKind())
	}
	var err error
	if u.GetNamespace() != "" {
		_, err = dyn.Resource(gvr).Namespace(u.GetNamespace()).Create(ctx, u, metav1.CreateOptions{})
	} else {
		_, err = dyn.Resource(gvr).Create(ctx, u, metav1.CreateOptions{})
	}
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	return nil
}

// ApplyYAML creates every document of a YAML text, as `kubectl apply -f` would.
func ApplyYAML(ctx context.Context, dyn dynamic.Interface, text []byte) error {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(text)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return err
		}
		if len(obj) > 0 {
			if err := Create(ctx, dyn, &unstructured.Unstructured{Object: obj}); err != nil {
				return err
			}
		}
	}
}
