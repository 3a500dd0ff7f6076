package kubelet

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

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
// file ending in .conf under the directory, subdirectories included, applied as a JSON
// merge patch (RFC 7386) in the order filepath.WalkDir visits them, with no sort of
// their paths. WalkDir reads each directory in lexical order of the names and descends
// into a subdirectory where its name falls, so 10/a.conf is applied before 10-z.conf
// ("10" sorts before "10-z.conf") although the path "…/10-z.conf" sorts before
// "…/10/a.conf". A missing file or directory is not an error (a kubelet without one);
// "" skips it. A drop-in that is not a kubelet.config.k8s.io/v1beta1
// KubeletConfiguration is refused, as the kubelet refuses it.
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
		// Merged inside the walk, as the kubelet merges: the walk's order is the order.
		var mergeErr error
		err := filepath.WalkDir(dropInDir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() || filepath.Ext(d.Name()) != dropInSuffix {
				return nil
			}
			if merged, mergeErr = mergeDropIn(merged, path); mergeErr != nil {
				return mergeErr
			}
			files = append(files, path)
			return nil
		})
		var missing *fs.PathError
		switch {
		case mergeErr != nil:
			return Config{}, mergeErr
		case errors.As(err, &missing) && missing.Path == dropInDir && errors.Is(err, fs.ErrNotExist):
			// No drop-in directory: a kubelet run without --config-dir.
		case err != nil:
			return Config{}, fmt.Errorf("kubelet drop-in directory %s: %w", dropInDir, err)
		}
	}
	var c Config
	if err := json.Unmarshal(merged, &c); err != nil {
		return Config{}, fmt.Errorf("kubelet config %s: %w", describe(file, dropInDir), err)
	}
	c.Files = files
	return c, nil
}

// dropInSuffix is the only extension the kubelet merges from its drop-in directory; it
// skips every other file.
const dropInSuffix = ".conf"

// mergeDropIn applies the drop-in at path over merged, refusing what the kubelet refuses
// (mergeKubeletConfigurations: no apiVersion/kind, or another than
// kubelet.config.k8s.io/v1beta1 KubeletConfiguration).
func mergeDropIn(merged []byte, path string) ([]byte, error) {
	data, err := fsutil.ReadRegular(path, maxConfigSize)
	if err != nil {
		return nil, fmt.Errorf("kubelet drop-in %s: %w", path, err)
	}
	patch, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("kubelet drop-in %s: %w", path, err)
	}
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := json.Unmarshal(patch, &tm); err != nil || tm.APIVersion == "" || tm.Kind == "" {
		return nil, fmt.Errorf("kubelet drop-in %s: no apiVersion/kind (the kubelet refuses it too)", path)
	}
	if tm.APIVersion != "kubelet.config.k8s.io/v1beta1" || tm.Kind != "KubeletConfiguration" {
		return nil, fmt.Errorf("kubelet drop-in %s: %s %s is not a kubelet.config.k8s.io/v1beta1 KubeletConfiguration (the kubelet refuses it too)", path, tm.APIVersion, tm.Kind)
	}
	if merged, err = jsonpatch.MergePatch(merged, patch); err != nil {
		return nil, fmt.Errorf("kubelet drop-in %s: merge: %w", path, err)
	}
	return merged, nil
}

func describe(file, dir string) string {
	if dir == "" {
		return file
	}
	return file + " with " + dir
}
