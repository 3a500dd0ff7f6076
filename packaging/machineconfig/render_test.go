package machineconfig

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	ign "github.com/coreos/ignition/v2/config/v3_4"
	"github.com/vincent-petithory/dataurl"
	"sigs.k8s.io/yaml"

	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/pinset"
)

func TestRenderFromTheRPMsFiles(t *testing.T) {
	shipped, err := os.ReadFile("../config/imagepind.toml")
	if err != nil {
		t.Fatal(err)
	}
	// The shipped config must be a valid imagepind config (all defaults).
	if _, err := conf.ParseConfig(string(shipped)); err != nil {
		t.Fatalf("packaging/config/imagepind.toml: %v", err)
	}
	set := []byte("apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nmetadata:\n  name: apps\n  labels: {machineconfiguration.openshift.io/role: worker}\nspec:\n  pinnedImages:\n  - name: quay.io/acme/app@sha256:" + strings.Repeat("a", 64) + "\n")
	for _, pool := range []string{"worker", "master"} {
		out, err := Render(Input{Pool: pool, Config: shipped, Sets: map[string][]byte{"apps.yaml": set}})
		if err != nil {
			t.Fatal(err)
		}
		var mc struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name   string            `json:"name"`
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
			Spec struct {
				Config json.RawMessage `json:"config"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(out, &mc); err != nil {
			t.Fatal(err)
		}
		if mc.Kind != "MachineConfig" || mc.APIVersion != "machineconfiguration.openshift.io/v1" || mc.Metadata.Name != "50-"+pool+"-imagepin" ||
			mc.Metadata.Labels["machineconfiguration.openshift.io/role"] != pool {
			t.Fatalf("%s: %+v", pool, mc.Metadata)
		}
		cfg, report, err := ign.Parse(mc.Spec.Config)
		if err != nil || report.IsFatal() {
			t.Fatalf("%s: ignition: %v %s", pool, err, report.String())
		}
		if cfg.Ignition.Version != "3.4.0" {
			t.Fatalf("ignition version %s", cfg.Ignition.Version)
		}
		files := map[string][]byte{}
		for _, f := range cfg.Storage.Files {
			d, err := dataurl.DecodeString(*f.Contents.Source)
			if err != nil {
				t.Fatal(err)
			}
			files[f.Path] = d.Data
		}
		if string(files[ConfigPath]) != string(shipped) {
			t.Fatalf("%s: the config differs from the file the RPM ships", pool)
		}
		var labels map[string]string
		if err := json.Unmarshal(files[LabelsPath], &labels); err != nil || len(labels) != 1 {
			t.Fatalf("%s: labels %s", pool, files[LabelsPath])
		}
		if _, ok := labels["node-role.kubernetes.io/"+pool]; !ok {
			t.Fatalf("%s: labels %v", pool, labels)
		}
		if l, err := pinset.ParseLabelsFile(files[LabelsPath]); err != nil || len(l) != 1 {
			t.Fatalf("imagepind would not read the labels file: %v", err)
		}
		if string(files[SetsDir+"/apps.yaml"]) != string(set) {
			t.Fatalf("%s: the set file did not reach the sets directory", pool)
		}
		if len(cfg.Storage.Directories) != 1 || cfg.Storage.Directories[0].Path != SetsDir {
			t.Fatalf("%s: directories %+v", pool, cfg.Storage.Directories)
		}
		if len(cfg.Systemd.Units) != 1 || cfg.Systemd.Units[0].Name != Unit || cfg.Systemd.Units[0].Enabled == nil || !*cfg.Systemd.Units[0].Enabled {
			t.Fatalf("%s: units %+v", pool, cfg.Systemd.Units)
		}
	}
	if _, err := Render(Input{Pool: "worker", Config: shipped, Sets: map[string][]byte{"../x.yaml": nil}}); err == nil {
		t.Fatal("a path as a set file name must be refused")
	}
}

// closestPolicy is the machine-config daemon's rule (FindClosestFilePolicyPathMatch):
// the longest policy path that is the file or a parent directory of it.
func closestPolicy(file string, policies []policyFile) (policyFile, bool) {
	var best policyFile
	found := false
	for _, p := range policies {
		if (file == p.Path || strings.HasPrefix(file, strings.TrimSuffix(p.Path, "/")+"/")) && len(p.Path) > len(best.Path) {
			best, found = p, true
		}
	}
	return best, found
}

type policyFile struct {
	Path    string `json:"path"`
	Actions []struct {
		Type    string `json:"type"`
		Restart *struct {
			ServiceName string `json:"serviceName"`
		} `json:"restart"`
	} `json:"actions"`
}

// Every file a MachineConfig of ours writes is covered: the config restarts imagepind,
// everything else (sets, labels) needs no action; nothing falls through to a reboot.
func TestDisruptionPolicyCoversEveryFile(t *testing.T) {
	raw, err := DisruptionPolicy()
	if err != nil {
		t.Fatal(err)
	}
	var mcfg struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct{ Name string }
		Spec       struct {
			NodeDisruptionPolicy struct {
				Files []policyFile `json:"files"`
			} `json:"nodeDisruptionPolicy"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(raw, &mcfg); err != nil {
		t.Fatal(err)
	}
	if mcfg.APIVersion != "operator.openshift.io/v1" || mcfg.Kind != "MachineConfiguration" || mcfg.Metadata.Name != "cluster" {
		t.Fatalf("%s %s %s", mcfg.APIVersion, mcfg.Kind, mcfg.Metadata.Name)
	}
	shipped, _ := os.ReadFile("../config/imagepind.toml")
	for _, cluster := range []bool{false, true} {
		out, err := Render(Input{Pool: "worker", Config: shipped, Sets: map[string][]byte{"a.yaml": []byte("x")}, Cluster: cluster})
		if err != nil {
			t.Fatal(err)
		}
		var mc struct {
			Spec struct {
				Config struct {
					Storage struct {
						Files []struct{ Path string } `json:"files"`
					} `json:"storage"`
				} `json:"config"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(out, &mc); err != nil {
			t.Fatal(err)
		}
		labels := false
		for _, f := range mc.Spec.Config.Storage.Files {
			p, ok := closestPolicy(f.Path, mcfg.Spec.NodeDisruptionPolicy.Files)
			if !ok || len(p.Actions) != 1 {
				t.Fatalf("%s: no policy: the MCO would reboot the node", f.Path)
			}
			a := p.Actions[0]
			switch f.Path {
			case ConfigPath:
				if a.Type != "Restart" || a.Restart == nil || a.Restart.ServiceName != Unit {
					t.Errorf("%s: %+v, want a restart of %s", f.Path, a, Unit)
				}
			default:
				if a.Type != "None" {
					t.Errorf("%s: %s, want None", f.Path, a.Type)
				}
			}
			labels = labels || f.Path == LabelsPath
		}
		// With the cluster sync imagepind writes the labels file itself: a MachineConfig
		// carrying it would trip the config drift monitor.
		if labels == cluster {
			t.Errorf("cluster=%v: labels file in the MachineConfig=%v", cluster, labels)
		}
	}
}
