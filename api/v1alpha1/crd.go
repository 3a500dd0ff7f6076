package v1alpha1

import (
	_ "embed"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// CRDYAML is the PinnedImageSet CustomResourceDefinition.
//
//go:embed pinnedimagesets.yaml
var CRDYAML []byte

// CRD returns the CustomResourceDefinition as an object for the dynamic client.
func CRD() (*unstructured.Unstructured, error) {
	var obj map[string]any
	if err := yaml.Unmarshal(CRDYAML, &obj); err != nil {
		return nil, fmt.Errorf("the embedded CRD: %w", err)
	}
	return &unstructured.Unstructured{Object: obj}, nil
}

// NodeDocument is what the node keeps of an object: apiVersion, kind, name, uid, labels and
// spec (not status, which changes on every rollup, nor server-side metadata). It is JSON,
// which the set parser reads as YAML without YAML 1.1's surprises.
func NodeDocument(u *unstructured.Unstructured) ([]byte, error) {
	md := map[string]any{"name": u.GetName(), "uid": string(u.GetUID())}
	if l := u.GetLabels(); len(l) > 0 {
		md["labels"] = l
	}
	apiVersion := u.GetAPIVersion()
	if apiVersion == "" {
		apiVersion = APIVersion
	}
	doc := map[string]any{"apiVersion": apiVersion, "kind": Kind, "metadata": md, "spec": u.Object["spec"]}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
