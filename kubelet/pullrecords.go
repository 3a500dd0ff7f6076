package kubelet

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// PullRecords are the kubelet's own records of the images it pulled
// (<root-dir>/image_manager/pulled, one ImagePulledRecord per image ID) and of the pulls
// it began (…/pulling, one ImagePullIntent per image name), which the kubelet keeps only
// with KubeletEnsureSecretPulledImages on (pkg/kubelet/images/pullmanager). An image
// with either is not "pre-loaded" for the kubelet any more.
type PullRecords struct {
	// Enabled: the records directory exists, so the kubelet has run with the feature on.
	Enabled bool
	// Pulled maps an image ID (the kubelet's imageRef) to its record.
	Pulled map[string]PulledRecord
	// Pulling are the image names with a pull intent.
	Pulling map[string]bool
	// Problems are the record files that could not be read (named, with why).
	Problems []string
}

// PulledRecord is the part of an ImagePulledRecord that decides: for each image name
// (without tag or digest), who may use the image without pulling it again.
type PulledRecord struct {
	ImageRef          string                     `json:"imageRef"`
	CredentialMapping map[string]PullCredentials `json:"credentialMapping"`
}

// PullCredentials are the credentials an image was pulled with. NodePodsAccessible: it
// was pulled without any, so every pod on the node may use it.
type PullCredentials struct {
	NodePodsAccessible        bool              `json:"nodePodsAccessible,omitempty"`
	KubernetesSecrets         []json.RawMessage `json:"kubernetesSecrets,omitempty"`
	KubernetesServiceAccounts []json.RawMessage `json:"kubernetesServiceAccounts,omitempty"`
}

// maxRecords bounds how many record files are read: the kubelet keeps a few per pod.
const maxRecords = 100000

// ReadPullRecords reads the records under the kubelet's root directory. A missing
// directory means the kubelet never ran with the feature (Enabled false), not an error.
func ReadPullRecords(rootDir string) (PullRecords, error) {
	r := PullRecords{Pulled: map[string]PulledRecord{}, Pulling: map[string]bool{}}
	base := filepath.Join(rootDir, "image_manager")
	if st, err := os.Stat(base); errors.Is(err, os.ErrNotExist) {
		return r, nil
	} else if err != nil {
		return r, fmt.Errorf("kubelet pull records %s: %w", base, err)
	} else if !st.IsDir() {
		return r, fmt.Errorf("kubelet pull records %s: not a directory", base)
	}
	r.Enabled = true
	read := func(dir string, each func(path string, data []byte) error) error {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("kubelet pull records %s: %w", dir, err)
		}
		if len(entries) > maxRecords {
			return fmt.Errorf("kubelet pull records %s: %d files, more than %d", dir, len(entries), maxRecords)
		}
		for _, e := range entries {
			if e.IsDir() {
				continue
			}
			path := filepath.Join(dir, e.Name())
			data, err := fsutil.ReadRegular(path, 1<<20)
			if err == nil {
				err = each(path, data)
			}
			if err != nil {
				r.Problems = append(r.Problems, fmt.Sprintf("%s: %v", path, err))
			}
		}
		return nil
	}
	if err := read(filepath.Join(base, "pulled"), func(path string, data []byte) error {
		var rec PulledRecord
		if err := json.Unmarshal(data, &rec); err != nil {
			return err
		}
		if rec.ImageRef == "" {
			return errors.New("no imageRef")
		}
		r.Pulled[rec.ImageRef] = rec
		return nil
	}); err != nil {
		return r, err
	}
	if err := read(filepath.Join(base, "pulling"), func(path string, data []byte) error {
		var intent struct {
			Image string `json:"image"`
		}
		if err := json.Unmarshal(data, &intent); err != nil {
			return err
		}
		if intent.Image == "" {
			return errors.New("no image")
		}
		r.Pulling[intent.Image] = true
		return nil
	}); err != nil {
		return r, err
	}
	return r, nil
}
