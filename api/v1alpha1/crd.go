package v1alpha1

import (
	_ "embed"
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
