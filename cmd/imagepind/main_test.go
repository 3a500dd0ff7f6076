package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/conf"
)

// imagepind on a fresh node (a DaemonSet's new host path: nothing but an empty state
// directory's parent) makes its state directory (0700) and its sets directory (0755)
// at start, so the cluster sync has somewhere to write the node's sets.
func TestRunMakesStateAndSetsDirs(t *testing.T) {
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "var", "lib", "imagepin")
	setsDir := filepath.Join(stateDir, "sets.d")
	cfgFile := filepath.Join(dir, "imagepind.toml")
	os.WriteFile(cfgFile, []byte("state_dir = \""+stateDir+"\"\nsets_dir = \""+setsDir+"\"\n"+
		"[cri]\nendpoint = \"unix://"+filepath.Join(dir, "no.sock")+"\"\nruntime = \"cri-o\"\n"), 0o644)
	cfg, err := conf.LoadConfig(cfgFile, true)
	if err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // it stops at once: what it made at start stays
	_ = run(ctx, cfg, nil, log)
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{stateDir, 0o700}, {setsDir, 0o755}} {
		st, err := os.Stat(d.path)
		if err != nil {
			t.Fatalf("imagepind started on a fresh node: %v", err)
		}
		if !st.IsDir() || st.Mode().Perm() != d.mode {
			t.Errorf("%s: mode %s, want a directory %s", d.path, st.Mode(), d.mode)
		}
	}
}
