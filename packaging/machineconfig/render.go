package machineconfig

import (
	"encoding/json"
	"fmt"
	"path"
	"sort"

	"github.com/coreos/ignition/v2/config/util"
	ign "github.com/coreos/ignition/v2/config/v3_4"
	"github.com/coreos/ignition/v2/config/v3_4/types"
	"github.com/vincent-petithory/dataurl"
	"sigs.k8s.io/yaml"
)

// Paths on the node, as the RPM and imagepind's defaults have them.
const (
	ConfigPath = "/etc/imagepin/imagepind.toml"
	LabelsPath = "/etc/imagepin/node-labels.json"
	SetsDir    = "/etc/imagepin/sets.d"
	Unit       = "imagepind.service"
)

// Input is what a pool's MachineConfig carries.
type Input struct {
	Pool string
	// Config is imagepind.toml (the RPM's default config, or the cluster's).
	Config []byte
	// Sets are PinnedImageSet files to place in the sets directory: file name → content.
	Sets map[string][]byte
	// Cluster: the config turns the cluster sync on, so imagepind writes the labels file
	// from the Node object. The MachineConfig then must not carry that file: the
	// machine-config daemon's config drift monitor degrades a node whose MachineConfig
	// files change on disk.
	Cluster bool
}

// Name is the MachineConfig's name for a pool.
func Name(pool string) string { return "50-" + pool + "-imagepin" }

// Render returns the MachineConfig as YAML.
func Render(in Input) ([]byte, error) {
	if in.Pool == "" {
		return nil, fmt.Errorf("pool: empty")
	}
	labels, err := json.Marshal(map[string]string{"node-role.kubernetes.io/" + in.Pool: ""})
	if err != nil {
		return nil, err
	}
	cfg := types.Config{Ignition: types.Ignition{Version: "3.4.0"}}
	cfg.Storage.Directories = append(cfg.Storage.Directories, types.Directory{
		Node: types.Node{Path: SetsDir}, DirectoryEmbedded1: types.DirectoryEmbedded1{Mode: util.IntToPtr(0o755)},
	})
	cfg.Storage.Files = append(cfg.Storage.Files, file(ConfigPath, in.Config, 0o644))
	if !in.Cluster {
		cfg.Storage.Files = append(cfg.Storage.Files, file(LabelsPath, append(labels, '\n'), 0o644))
	}
	names := make([]string, 0, len(in.Sets))
	for n := range in.Sets {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if n != path.Base(n) || n == "." || n == ".." {
			return nil, fmt.Errorf("set file name %q: a plain file name", n)
		}
		cfg.Storage.Files = append(cfg.Storage.Files, file(path.Join(SetsDir, n), in.Sets[n], 0o644))
	}
	// Enabled, not defined: the RPM ships the unit.
	cfg.Systemd.Units = append(cfg.Systemd.Units, types.Unit{Name: Unit, Enabled: util.BoolToPtr(true)})

	// Validate with Ignition's own parser, as the machine-config-daemon does.
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	if _, report, err := ign.Parse(raw); err != nil {
		return nil, fmt.Errorf("ignition config does not validate: %v: %s", err, report.String())
	}
	mc := map[string]any{
		"apiVersion": "machineconfiguration.openshift.io/v1",
		"kind":       "MachineConfig",
		"metadata": map[string]any{
			"name":   Name(in.Pool),
			"labels": map[string]string{"machineconfiguration.openshift.io/role": in.Pool},
		},
		"spec": map[string]any{"config": json.RawMessage(raw)},
	}
	return yaml.Marshal(mc)
}

func file(p string, content []byte, mode int) types.File {
	src := dataurl.EncodeBytes(content)
	return types.File{
		Node: types.Node{Path: p, Overwrite: util.BoolToPtr(true)},
		FileEmbedded1: types.FileEmbedded1{
			Mode:     util.IntToPtr(mode),
			Contents: types.Resource{Source: &src},
		},
	}
}

// DisruptionPolicyDir is what the node disruption policy covers: every file a
// MachineConfig of ours writes lives under it.
const DisruptionPolicyDir = "/etc/imagepin"

// DisruptionPolicy returns the MachineConfiguration "cluster" (operator.openshift.io/v1,
// OpenShift 4.17+) whose spec.nodeDisruptionPolicy applies changes under /etc/imagepin
// with no action (sets and labels are followed by imagepind itself) and restarts
// imagepind.service for its config file. The machine-config daemon picks the closest
// policy path (FindClosestFilePolicyPathMatch), so the config file's entry wins over the
// directory's. Without it, the MCO drains and reboots every node of the pool, one by one,
// for any change of those files.
func DisruptionPolicy() ([]byte, error) {
	return yaml.Marshal(map[string]any{
		"apiVersion": "operator.openshift.io/v1",
		"kind":       "MachineConfiguration",
		"metadata":   map[string]any{"name": "cluster"},
		"spec": map[string]any{
			"nodeDisruptionPolicy": map[string]any{
				"files": []any{
					map[string]any{"path": DisruptionPolicyDir, "actions": []any{map[string]any{"type": "None"}}},
					map[string]any{"path": ConfigPath, "actions": []any{map[string]any{
						"type": "Restart", "restart": map[string]any{"serviceName": Unit}}}},
				},
			},
		},
	})
}
