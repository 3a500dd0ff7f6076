// Package pinset is the PinnedImageSet model as a node reads it: parsing the documents
// of a set file (the enhancement's v1alpha1 shape, OpenShift's v1, imagepin's own
// imagepin.io/v1alpha1 objects), validation with errors that name the file, document,
// set and field, label selectors and node labels, the sets directory (its files in the
// one order every reader uses, the cluster sync's subdirectory) and the mapping from an
// API object's name to its file there. Its constants come from api/v1alpha1.
//
// It knows nothing of imagepind's own configuration (package conf) or of the runtimes.
package pinset
