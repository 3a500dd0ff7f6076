package kubelet

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// PullRecords are the kubelet's own records of the images it pulled
// (<root-dir>/image_manager/pulled, one ImagePulledRecord per image ID) and of the pulls
// it began (…/pulling, one ImagePullIntent per image name), which the kubelet keeps only
// with KubeletEnsureSecretPulledImages on (pkg/kubelet/images/pullmanager). An image
// with either is not "pre-loaded" for the kubelet any more.
//
// The kubelet looks a record up by its file name, "sha256-" and the hex SHA-256 of the
// image ID (pulled) or of the image as a pod names it (pulling), and takes it only when
// what the file says matches (fs_pullrecords.go GetImagePulledRecord,
// ImagePullIntentExists): the records here are kept the same way, so a file at another
// name counts for nothing, as for the kubelet.
type PullRecords struct {
	// Enabled: the records directory exists, so the kubelet has run with the feature on.
	Enabled bool
	// Pulled maps an image ID (the kubelet's imageRef) to its record.
	Pulled map[string]PulledRecord
	// Pulling are the image names with a pull intent.
	Pulling map[string]bool
	// Unreadable are the record files that could not be read or decoded, by their path
	// under image_manager ("pulled/sha256-…"). When the kubelet cannot read the record
	// of an image, it goes to the registry for it whatever its policy
	// (image_pull_manager.go MustAttemptImagePull: "Unable to access cache records about
	// image pulls" → pull).
	Unreadable map[string]Unreadable
}

// Unreadable is a record file that could not be read, and why.
type Unreadable struct {
	Path string
	Err  string
	// KubeletFails: the kubelet fails on it as well (not JSON, not a record of the kind
	// the directory holds, a directory); else only imagepind could not read it (too
	// large for imagepind's bound, no permission, not a regular file) and what the
	// kubelet makes of it is not known.
	KubeletFails bool
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
	NodePodsAccessible        bool                 `json:"nodePodsAccessible,omitempty"`
	KubernetesSecrets         []pullSecret         `json:"kubernetesSecrets,omitempty"`
	KubernetesServiceAccounts []pullServiceAccount `json:"kubernetesServiceAccounts,omitempty"`
}

// pullSecret and pullServiceAccount are the kubelet's v1alpha1 ImagePullSecret and
// ImagePullServiceAccount, whole, so that decoding refuses what the kubelet's strict
// decoder refuses.
type pullSecret struct {
	UID            string `json:"uid"`
	Namespace      string `json:"namespace"`
	Name           string `json:"name"`
	CredentialHash string `json:"credentialHash"`
}

type pullServiceAccount struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

const (
	// recordsV1alpha1 and recordsV1beta1 are the versions the kubelet's records decoder
	// knows (fs_pullrecords.go createKubeletConfigSchemeEncoderDecoder). The kubelet
	// 1.33 and 1.34 write v1alpha1; 1.35 writes v1beta1 (encodeVersion) and reads both,
	// rewriting a v1alpha1 record at start. The two carry the same fields.
	recordsV1alpha1 = "kubelet.config.k8s.io/v1alpha1"
	recordsV1beta1  = "kubelet.config.k8s.io/v1beta1"
	// recordPrefix and tmpSuffix are the kubelet's cacheFilesSHA256Prefix and
	// tmpFilesSuffix.
	recordPrefix = "sha256-"
	tmpSuffix    = ".tmp"
)

// maxRecords bounds how many record files are read: the kubelet keeps a few per pod.
const maxRecords = 100000

// maxRecordSize bounds the read of one record file. The kubelet reads them whole
// (os.ReadFile); a record is a few hundred bytes per credential it holds, so this bound
// is far above any the kubelet writes and is only there against a hostile file. A record
// over it is Unreadable, and its image is not called registry-independent.
var maxRecordSize int64 = 64 << 20 // a variable for the tests

// recordFile is the file name the kubelet keeps the record of key under
// (fs_pullrecords.go cacheFilename).
func recordFile(key string) string {
	return fmt.Sprintf("%s%x", recordPrefix, sha256.Sum256([]byte(key)))
}

// ReadPullRecords reads the records under the kubelet's root directory. A missing
// directory means the kubelet never ran with the feature (Enabled false), not an error.
// A record file that cannot be read is kept in Unreadable, for the image it belongs to;
// a records directory that cannot be listed is an error.
func ReadPullRecords(rootDir string) (PullRecords, error) {
	r := PullRecords{Pulled: map[string]PulledRecord{}, Pulling: map[string]bool{}, Unreadable: map[string]Unreadable{}}
	base := filepath.Join(rootDir, "image_manager")
	if st, err := os.Stat(base); errors.Is(err, os.ErrNotExist) {
		return r, nil
	} else if err != nil {
		return r, fmt.Errorf("kubelet pull records %s: %w", base, err)
	} else if !st.IsDir() {
		return r, fmt.Errorf("kubelet pull records %s: not a directory", base)
	}
	r.Enabled = true
	read := func(sub string, each func(name string, data []byte) error) error {
		dir := filepath.Join(base, sub)
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
			// The kubelet opens only the names it computes, never a .tmp file; a
			// directory at such a name fails its read, so it is read (and fails) here too.
			name := e.Name()
			if !strings.HasPrefix(name, recordPrefix) || strings.HasSuffix(name, tmpSuffix) {
				continue
			}
			path := filepath.Join(dir, name)
			data, err := fsutil.ReadRegular(path, maxRecordSize)
			kubeletFails := false
			switch {
			case errors.Is(err, os.ErrNotExist):
				continue // removed since listed: the kubelet has no record either
			case err != nil:
				st, serr := os.Stat(path)
				kubeletFails = serr == nil && st.IsDir()
			default:
				if err = each(name, data); err != nil {
					kubeletFails = true
				}
			}
			if err != nil {
				r.Unreadable[sub+"/"+name] = Unreadable{Path: path, Err: err.Error(), KubeletFails: kubeletFails}
			}
		}
		return nil
	}
	if err := read("pulled", func(name string, data []byte) error {
		var rec struct {
			typeMeta
			LastUpdatedTime string `json:"lastUpdatedTime"`
			PulledRecord
		}
		if err := decodeRecord(data, &rec, "ImagePulledRecord", &rec.typeMeta); err != nil {
			return err
		}
		if rec.LastUpdatedTime != "" {
			if _, err := time.Parse(time.RFC3339, rec.LastUpdatedTime); err != nil {
				return fmt.Errorf("lastUpdatedTime: %w", err)
			}
		}
		if name == recordFile(rec.ImageRef) {
			r.Pulled[rec.ImageRef] = rec.PulledRecord
		}
		return nil
	}); err != nil {
		return r, err
	}
	if err := read("pulling", func(name string, data []byte) error {
		var intent struct {
			typeMeta
			Image string `json:"image"`
		}
		if err := decodeRecord(data, &intent, "ImagePullIntent", &intent.typeMeta); err != nil {
			return err
		}
		if name == recordFile(intent.Image) {
			r.Pulling[intent.Image] = true
		}
		return nil
	}); err != nil {
		return r, err
	}
	return r, nil
}

type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// decodeRecord decodes as strictly as the kubelet's decoder: one JSON object, no field
// it does not know, its apiVersion and kind.
func decodeRecord(data []byte, into any, kind string, tm *typeMeta) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(into); err != nil {
		return err
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return errors.New("data after the record")
	}
	if (tm.APIVersion != recordsV1alpha1 && tm.APIVersion != recordsV1beta1) || tm.Kind != kind {
		return fmt.Errorf("%q %q is not a %s (%s or %s)", tm.APIVersion, tm.Kind, kind, recordsV1beta1, recordsV1alpha1)
	}
	return nil
}
