package diskcheck

import (
	"math"

	"github.com/imagepin/imagepin/registry"
)

// Need is what pulling the layer takes on the image filesystem: at least multiplier ×
// the compressed size (the administrator's rule stays the floor), and, when the
// uncompressed size is known, the layer stored uncompressed plus its compressed blob
// held while it is applied. It saturates rather than wraps.
func Need(l registry.Layer, multiplier float64) uint64 {
	if l.Size <= 0 {
		return 0
	}
	need := mulSat(uint64(l.Size), multiplier)
	if l.Uncompressed > 0 {
		need = max(need, registry.AddSat(uint64(l.Uncompressed), uint64(l.Size)))
	}
	return need
}

// NeedMost is Need with the layer's uncompressed size at the most its Range request
// could report (Layer.MaxUncompressed) while it is not asked yet: the most pulling it can
// take.
func NeedMost(l registry.Layer, multiplier float64) uint64 {
	if l.MaxUncompressed > 0 {
		l.Uncompressed = l.MaxUncompressed
	}
	return Need(l, multiplier)
}

// mulSat is n × f (f ≥ 0), saturating at the largest uint64.
func mulSat(n uint64, f float64) uint64 {
	v := float64(n) * f
	if v >= math.MaxUint64 {
		return math.MaxUint64
	}
	return uint64(v)
}
