package sourcetest_test

import (
	"testing"

	"github.com/imagepin/imagepin/mirror"
	"github.com/imagepin/imagepin/mirror/sourcetest"
)

// The in-memory fake keeps the contract it stands in for.
func TestFakeConforms(t *testing.T) {
	sourcetest.Run(t, sourcetest.Subject{New: func(_ *testing.T, o *sourcetest.Origin) mirror.Source {
		return sourcetest.FakeOf(o)
	}})
}
