// Package env starts the real components the end-to-end tests and `make demo` run
// against: a docker-registry (distribution) on loopback with images pushed from Go, and
// a real CRI-O (1.36.3; built and cached by hack/e2e-deps.sh) with its own root, socket and
// config in a temporary directory. Nothing here is a fake.
package env
