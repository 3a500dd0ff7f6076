// Package conf is imagepind's own configuration: the TOML file (defaults, strict
// decoding, validation with errors that name the key) and the paths and settings the
// other parts are given from it. The PinnedImageSet model is package pinset.
package conf
