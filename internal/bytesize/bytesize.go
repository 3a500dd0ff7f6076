// Package bytesize prints byte counts for people, in binary units ("1.5 GiB"), the one
// way imagepind's messages and imagepinctl's output show sizes.
package bytesize

import "fmt"

// Human is b in the largest binary unit that keeps it at 1 or more, one decimal.
func Human(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit && exp < 4; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTP"[exp])
}
