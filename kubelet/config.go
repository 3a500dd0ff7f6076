package kubelet

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	"sigs.k8s.io/yaml"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// maxConfigSize bounds each file read: a kubelet config is a few kB.
const maxConfigSize = 4 << 20

// Config is the part of a KubeletConfiguration imagepind reads.
type Config struct {
	ImageGCHighThresholdPercent *int            `json:"imageGCHighThresholdPercent,omitempty"`
	FeatureGates                map[string]bool `json:"featureGates,omitempty"`
	// ImagePullCredentialsVerificationPolicy is "" when not set (the kubelet's default
	// applies).
	ImagePullCredentialsVerificationPolicy string   `json:"imagePullCredentialsVerificationPolicy,omitempty"`
	PreloadedImagesVerificationAllowlist   []string `json:"preloadedImagesVerificationAllowlist,omitempty"`

	// Files are the files read, the main config first, then the drop-ins in the order
	// they were merged.
	Files []string `json:"-"`
}

// LoadConfig reads the kubelet's config file and merges the drop-ins of dropInDir over
// it as the kubelet does (cmd/kubelet/app/server.go mergeKubeletConfigurations): every
// file ending in .conf under the directory, walked in lexical order (subdirectories
// included), applied as a JSON merge patch (RFC 7386). A missing file or directory is
// not an error (a kubelet without one); "" skips it. A drop-in without apiVersion and
// kind is refused, as the kubelet refuses it.
func LoadConfig(file, dropInDir string) (Config, error) {
	merged := []byte("{}")
	var files []string
	if file != "" {
		data, err := fsutil.ReadRegular(file, maxConfigSize)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return Config{}, fmt.Errorf("kubelet config %s: %w", file, err)
		default:
			if merged, err = yaml.YAMLToJSON(data); err != nil {
				return Config{}, fmt.Errorf("kubelet config %s: %w", file, err)
			}
			files = append(files, file)
		}
	}
	if dropInDir != "" {
		var dropIns []string
		err := filepath.WalkDir(dropInDir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && filepath.Ext(d.Name()) == ".conf" {
				dropIns = append(dropIns, path)
			}
			return nil
		})
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return Config{}, fmt.Errorf("kubelet drop-in directory %s: %w", dropInDir, err)
		}
		sort.Strings(dropIns) // WalkDir's order already; said here for the reader
		for _, path := range dropIns {
			data, err := fsutil.ReadRegular(path, maxConfigSize)
			if err != nil {
				return Config{}, fmt.Errorf("kubelet drop-in %s: %w", path, err)
			}
			patch, err := yaml.YAMLToJSON(data)
			if err != nil {
				return Config{}, fmt.Errorf("kubelet drop-in %s: %w", path, err)
			}
			var tm struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
			}
			if err := json.Unmarshal(patch, &tm); err != nil || tm.APIVersion == "" || tm.Kind == "" {
				return Config{}, fmt.Errorf("kubelet drop-in %s: no apiVersion/kind (the kubelet refuses it too)", path)
			}
			if merged, err = jsonpatch.MergePatch(merged, patch); err != nil {
				return Config{}, fmt.Errorf("kubelet drop-in %s: merge: %w", path, err)
			}
			files = append(files, path)
		}
	}
	var c Config
	if err := json.Unmarshal(merged, &c); err != nil {
		return Config{}, fmt.Errorf("kubelet config %s: %w", describe(file, dropInDir), err)
	}
	c.Files = files
	return c, nil
}

func describe(file, dir string) string {
	if dir == "" {
		return file
	}
	return file + " with " + dir
}
