package main

import (
	"io"
	"path/filepath"
	"strings"
	"testing"
)

// A time that is not whole seconds since 1970 is refused before anything is built.
func TestRunRefusesEpoch(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	for _, e := range []string{"yesterday", "-5", "1.5"} {
		err := run(options{bin: t.TempDir(), out: out, arches: "amd64", epoch: e}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), `-epoch "`+e+`"`) {
			t.Errorf("epoch %q: %v", e, err)
		}
	}
}
