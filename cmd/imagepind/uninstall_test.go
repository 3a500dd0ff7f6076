package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imagepin/imagepin/state"
)

// imagepind uninstall refuses to run while the daemon holds the state lock (it takes it
// at start, state.Store.Lock), changes nothing, and --status then says not given back.
func TestUninstallRefusedWhileDaemonRuns(t *testing.T) {
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	cfg := filepath.Join(dir, "c.toml")
	os.WriteFile(cfg, []byte("state_dir = \""+stateDir+"\"\n"), 0o644)
	store, err := state.Open(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := store.Lock() // the daemon
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	os.WriteFile(filepath.Join(stateDir, "state.json"), []byte("{}"), 0o600)
	var out, errOut bytes.Buffer
	if code := uninstall([]string{"--config=" + cfg}, &out, &errOut); code != uninstallNo {
		t.Fatalf("uninstall while the daemon runs: exit %d, want %d\n%s", code, uninstallNo, errOut.String())
	}
	if !strings.Contains(errOut.String(), "stop it first") {
		t.Errorf("stderr %q: want it to say the daemon runs", errOut.String())
	}
	if _, err := os.Stat(filepath.Join(stateDir, "state.json")); err != nil {
		t.Errorf("the daemon's state was touched: %v", err)
	}
	if code := uninstall([]string{"--status", "--config=" + cfg}, &out, &errOut); code != uninstallNo {
		t.Errorf("--status on a node not given back: exit %d, want %d", code, uninstallNo)
	}
}
