package crio

import (
	"fmt"
	"strconv"
	"strings"
)

// Support is what a CRI-O version can do with pins.
type Support struct {
	// PinnedImages: the pinned_images option exists (1.28).
	PinnedImages bool
	// PinOnReload: new pins take effect on reload (1.29.4, 1.30.0).
	PinOnReload bool
	// UnpinOnReload: removed pins stop on reload (1.29.7, 1.30.3, 1.31).
	UnpinOnReload bool
	// PinnedField: CRI Image.pinned is filled (1.31).
	PinnedField bool
	// PullReturnsImageID: CRI PullImage returns the image ID, as ImageStatus reports it
	// (1.35.2, 1.36.0); before, a repository digest (repo@sha256:…). The kubelet keys the
	// record of its own pull by what PullImage returns and looks it up by the image ID, so
	// before that it never finds its own pulls' records (docs/registry-gone.md).
	PullReturnsImageID bool
	// TLSPerEndpoint: CRI-O verifies TLS on each endpoint of a pull as registries.conf
	// says of that endpoint (1.35.0: insecure_registries no longer has any effect, and
	// 127.0.0.0/8 is no longer insecure by itself); before, it verified no endpoint of a
	// pull, mirrors included, whose image's registry it held insecure (VerifiesTLS).
	TLSPerEndpoint bool
}

// SupportOf returns what the CRI-O version (as CRI Version reports it, e.g. "1.34.0")
// supports. An unparsable version is assumed current: the runtime answered CRI, and
// refusing to work on an unknown version string would be worse than trying.
func SupportOf(version string) (Support, error) {
	v, err := parseVersion(version)
	if err != nil {
		return Support{true, true, true, true, true, true}, err
	}
	at := func(min ...[3]int) bool {
		for _, m := range min {
			if v[0] == m[0] && v[1] == m[1] && v[2] >= m[2] {
				return true
			}
		}
		last := min[len(min)-1]
		return v[0] > last[0] || (v[0] == last[0] && v[1] > last[1])
	}
	return Support{
		PinnedImages:       at([3]int{1, 28, 0}),
		PinOnReload:        at([3]int{1, 29, 4}, [3]int{1, 30, 0}),
		UnpinOnReload:      at([3]int{1, 29, 7}, [3]int{1, 30, 3}, [3]int{1, 31, 0}),
		PinnedField:        at([3]int{1, 31, 0}),
		PullReturnsImageID: at([3]int{1, 35, 2}, [3]int{1, 36, 0}),
		TLSPerEndpoint:     at([3]int{1, 35, 0}),
	}, nil
}

// TooOld explains, for status, why pins will not apply on reload; "" when they will.
func (s Support) TooOld(version string) string {
	switch {
	case !s.PinnedImages:
		return fmt.Sprintf("CRI-O %s has no pinned_images (needs 1.28 or later): images are pulled but cannot be pinned", version)
	case !s.PinOnReload:
		return fmt.Sprintf("CRI-O %s applies pinned_images only when it starts (1.29.4/1.30.0 apply them on reload): restart CRI-O for the pins to apply", version)
	}
	return ""
}

func parseVersion(s string) ([3]int, error) {
	var v [3]int
	s = strings.TrimPrefix(strings.TrimSpace(s), "v")
	if i := strings.IndexAny(s, "-+~"); i >= 0 {
		s = s[:i]
	}
	parts := strings.Split(s, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return v, fmt.Errorf("runtime version %q is not major.minor.patch", s)
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return v, fmt.Errorf("runtime version %q is not major.minor.patch", s)
		}
		v[i] = n
	}
	return v, nil
}
