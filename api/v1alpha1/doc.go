// Package v1alpha1 is imagepin's own Kubernetes API: the cluster-scoped PinnedImageSet
// custom resource in the group imagepin.io. Its spec is the shape OpenShift shipped
// (spec.pinnedImages[].name, the machineconfiguration.openshift.io/role pool label)
// plus the enhancement's spec.nodeSelector, spec.releaseImage and spec.osImageStream;
// its status is the aggregator's rollup across the nodes the set targets.
//
// The CRD (CRD, pinnedimagesets.yaml) is the single source of the schema: it enforces
// what package conf enforces on a node (digest-only, fully qualified references, at
// most 2000 images, unique names), and conf accepts the same document as a file, so
// one document works in the sets directory and in the API.
//
// The types are plain JSON shapes: imagepin talks to the API with the dynamic client
// and converts, so no generated deep-copy code is needed.
package v1alpha1
