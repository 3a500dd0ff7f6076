// Command render is `make machineconfig`: one MachineConfig per pool from the config the
// RPM ships, plus any PinnedImageSet files given with -sets (they land in the sets
// directory of that pool's nodes).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/internal/fsutil"
	"github.com/imagepin/imagepin/packaging/machineconfig"
	"github.com/imagepin/imagepin/pinset"
)

func main() {
	config := flag.String("config", "packaging/config/imagepind.toml", "imagepind.toml to install")
	out := flag.String("out", "_output/machineconfig", "output directory")
	pools := flag.String("pools", "worker,master", "pools")
	setsDir := flag.String("sets", "", "optional directory of PinnedImageSet files to ship (validated)")
	flag.Parse()
	if err := run(*config, *out, *pools, *setsDir); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}

func run(configPath, out, pools, setsDir string) error {
	cfg, err := os.ReadFile(configPath)
	if err != nil {
		return err
	}
	parsed, err := conf.ParseConfig(string(cfg))
	if err != nil {
		return fmt.Errorf("%s: %w", configPath, err)
	}
	if parsed.Node.LabelsFile != machineconfig.LabelsPath {
		return fmt.Errorf("%s: node.labels_file must be %s, where the MachineConfig (or the cluster sync) writes the labels", configPath, machineconfig.LabelsPath)
	}
	sets := map[string][]byte{}
	if setsDir != "" {
		files, err := pinset.ReadSetsDir(setsDir, false)
		if err != nil {
			return err
		}
		for _, f := range files {
			if f.Err != nil {
				return fmt.Errorf("%s: %w", f.Name, f.Err)
			}
			if _, err := pinset.ParseSetFile(f.Name, f.Data); err != nil {
				return err
			}
			sets[f.Name] = f.Data
		}
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, pool := range strings.Split(pools, ",") {
		data, err := machineconfig.Render(machineconfig.Input{Pool: pool, Config: cfg, Sets: sets, Cluster: parsed.Cluster.Kubeconfig != ""})
		if err != nil {
			return fmt.Errorf("%s: %w", pool, err)
		}
		p := filepath.Join(out, machineconfig.Name(pool)+".yaml")
		if err := fsutil.WriteAtomic(p, "", data, 0o644); err != nil {
			return err
		}
		fmt.Println(p)
	}
	policy, err := machineconfig.DisruptionPolicy()
	if err != nil {
		return err
	}
	p := filepath.Join(out, "machineconfiguration-cluster.yaml")
	if err := fsutil.WriteAtomic(p, "", policy, 0o644); err != nil {
		return err
	}
	fmt.Println(p)
	return nil
}
