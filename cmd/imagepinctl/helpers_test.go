package main

import (
	"syscall"
	"testing"

	"github.com/imagepin/imagepin/state"
)

func mkfifo(p string) error { return syscall.Mkfifo(p, 0o600) }

func lockState(t *testing.T, dir string) func() {
	t.Helper()
	s, err := state.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := s.Lock()
	if err != nil {
		t.Fatal(err)
	}
	return unlock
}
