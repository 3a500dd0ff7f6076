package diskcheck

import (
	"fmt"
	"strings"

	"github.com/imagepin/imagepin/kubelet"
	"golang.org/x/sys/unix"
)

// Space is a filesystem's size as statfs and the kubelet see it.
type Space struct {
	Capacity  uint64
	Available uint64
}

// Used is what the kubelet counts as used: capacity − available.
func (s Space) Used() uint64 {
	if s.Available > s.Capacity {
		return 0
	}
	return s.Capacity - s.Available
}

// Statfs measures the filesystem holding path.
func Statfs(path string) (Space, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return Space{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	return Space{Capacity: st.Blocks * uint64(st.Bsize), Available: st.Bavail * uint64(st.Bsize)}, nil
}

// DefaultGCHighThresholdPercent is the kubelet's default imageGCHighThresholdPercent.
const DefaultGCHighThresholdPercent = 85

// GCHighThreshold is the configured percent, else the kubelet's from its config file
// and drop-in directory (merged as the kubelet merges them: package kubelet) when
// present, else 85. It says where the value came from.
func GCHighThreshold(configured int, kubeletConfig, kubeletConfigDir string) (int, string, error) {
	if configured > 0 {
		return configured, "gc_high_threshold_percent", nil
	}
	if kubeletConfig == "" && kubeletConfigDir == "" {
		return DefaultGCHighThresholdPercent, "the kubelet's default", nil
	}
	kc, err := kubelet.LoadConfig(kubeletConfig, kubeletConfigDir)
	if err != nil {
		return DefaultGCHighThresholdPercent, "the kubelet's default", err
	}
	if kc.ImageGCHighThresholdPercent == nil {
		return DefaultGCHighThresholdPercent, "the kubelet's default", nil
	}
	from := strings.Join(kc.Files, " + ")
	v := *kc.ImageGCHighThresholdPercent
	if v <= 0 || v > 100 {
		return DefaultGCHighThresholdPercent, "the kubelet's default", fmt.Errorf("kubelet config %s: imageGCHighThresholdPercent %d out of range", from, v)
	}
	return v, from, nil
}
