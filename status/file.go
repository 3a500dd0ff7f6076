package status

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// WriteFile writes the node status as indented JSON, atomically.
func WriteFile(path string, n Node) error {
	b, err := json.MarshalIndent(n, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dirOf(path), 0o755); err != nil {
		return fmt.Errorf("status file: %w", err)
	}
	return fsutil.WriteAtomic(path, "", append(b, '\n'), 0o644)
}

// ReadFile reads a status file.
func ReadFile(path string) (Node, error) {
	var n Node
	b, err := fsutil.ReadRegular(path, 64<<20)
	if err != nil {
		return n, err
	}
	if err := json.Unmarshal(b, &n); err != nil {
		return n, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

func dirOf(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			if i == 0 {
				return "/"
			}
			return p[:i]
		}
	}
	return "."
}
