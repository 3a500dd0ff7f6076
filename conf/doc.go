// Package conf reads what imagepind is given: its TOML config file, PinnedImageSet
// documents from the sets directory, node labels, and Kubernetes label selectors.
// Everything here is pure parsing and validation; nothing talks to CRI-O or a registry.
package conf
