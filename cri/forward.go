package cri

import "github.com/imagepin/imagepin/pullcreds"

// Forwarding names for code other branches are editing at the same time; new code uses
// package pullcreds. Remove each once its last user has moved.

// Auth is pullcreds.Auth (mirror/mirror_test.go still names it here).
type Auth = pullcreds.Auth

// KeyringFile is pullcreds.SecretFile, the pull secret file (cmd/imagepinctl/check.go and
// cmd/internal/wire/peers.go still name it here).
type KeyringFile = pullcreds.SecretFile
