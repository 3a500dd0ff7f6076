package pinset

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// MaxLabelsFileSize bounds the labels file; a node has a few dozen labels.
const MaxLabelsFileSize = 1 << 20

// ValidateLabels checks label keys and values as the Kubernetes API server does.
func ValidateLabels(labels map[string]string) error {
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("label key %q: %s", k, strings.Join(msgs, "; ")))
		}
		if msgs := validation.IsValidLabelValue(labels[k]); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("label %q value %q: %s", k, labels[k], strings.Join(msgs, "; ")))
		}
	}
	return errors.Join(errs...)
}

// ParseLabelsFile parses the labels file: a JSON object of string labels.
func ParseLabelsFile(data []byte) (map[string]string, error) {
	var labels map[string]string
	if err := json.Unmarshal(data, &labels); err != nil {
		return nil, fmt.Errorf("not a JSON object of string labels: %w", err)
	}
	if labels == nil {
		return nil, errors.New("not a JSON object of string labels: null")
	}
	if err := ValidateLabels(labels); err != nil {
		return nil, err
	}
	return labels, nil
}

// MergeLabels returns the inline labels overlaid with the labels file's: the file is
// written by the pool's MachineConfig and is the more specific source.
func MergeLabels(inline, file map[string]string) map[string]string {
	out := make(map[string]string, len(inline)+len(file))
	maps.Copy(out, inline)
	maps.Copy(out, file)
	return out
}
