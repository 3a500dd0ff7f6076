package cri

import "github.com/imagepin/imagepin/pullcreds"

// Forwarding names for code other branches are editing at the same time; new code uses
// package pullcreds. Remove each once its last user has moved.

// KeyringFile is pullcreds.SecretFile, the pull secret file (cmd/internal/wire/peers.go still
// names it here).
type KeyringFile = pullcreds.SecretFile
