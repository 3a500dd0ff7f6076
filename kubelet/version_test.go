package kubelet

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Which fact decides the feature gate: the config's entry wins, then a kubelet of 1.35
// or later, then pull records, then a kubelet before 1.35; with none of them it is not
// known (a node whose kubelet has not started yet).
func TestGate(t *testing.T) {
	v := func(major, minor int) Version {
		return Version{Major: major, Minor: minor, Text: "v" + string(rune('0'+major)) + ".x", From: "/usr/bin/kubelet --version"}
	}
	off, on := map[string]bool{FeatureGate: false}, map[string]bool{FeatureGate: true}
	enabled := PullRecords{Enabled: true}
	for _, c := range []struct {
		name    string
		gates   map[string]bool
		records PullRecords
		version Version
		want    GateState
		why     string
	}{
		{"config false beats 1.35 and records", off, enabled, v(1, 35), GateOff, "false in the kubelet config"},
		{"config true beats 1.34", on, PullRecords{}, v(1, 34), GateOn, "true in the kubelet config"},
		{"1.35, no records yet", nil, PullRecords{}, v(1, 35), GateOn, "on by default from Kubernetes 1.35"},
		{"1.36", nil, PullRecords{}, v(1, 36), GateOn, "on by default"},
		{"2.0", nil, PullRecords{}, v(2, 0), GateOn, "on by default"},
		{"1.34 with records: turned on elsewhere", nil, enabled, v(1, 34), GateOn, "keeps pull records"},
		{"1.34", nil, PullRecords{}, v(1, 34), GateOff, "off by default before Kubernetes 1.35"},
		{"1.33", nil, PullRecords{}, v(1, 33), GateOff, "off by default"},
		{"1.32 (no such gate)", nil, PullRecords{}, v(1, 32), GateOff, "off by default"},
		{"version unknown, records", nil, enabled, Version{From: "x: no such file"}, GateOn, "keeps pull records"},
		{"version unknown, no records", nil, PullRecords{}, Version{From: "/usr/bin/kubelet --version: no such file"}, GateUnknown, "version is not known (/usr/bin/kubelet --version: no such file)"},
		{"nothing known", nil, PullRecords{}, Version{}, GateUnknown, "cannot be told"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, why := gate(Config{FeatureGates: c.gates}, c.records, c.version)
			if got != c.want || !strings.Contains(why, c.why) {
				t.Fatalf("gate %v %q, want %v containing %q", got, why, c.want, c.why)
			}
		})
	}
}

// With the gate's state not known, the answer is Starts only where it is Starts with the
// gate on and off alike; where the gate on would send a pod to the registry it is
// Unknown, never Starts.
func TestDecideWithTheGateUnknown(t *testing.T) {
	const app = "reg.example/team/app@sha256:1111111111111111111111111111111111111111111111111111111111111111"
	for _, c := range []struct {
		policy string
		answer Answer
		msg    string
	}{
		{AlwaysVerify, Unknown, "AlwaysVerify checks every pod's credentials, if " + FeatureGate + " is on); whether " + FeatureGate + " is on cannot be told"},
		{NeverVerifyAllowlistedImages, Unknown, "not in preloadedImagesVerificationAllowlist, if"},
		{"", Starts, "pods start from these 1 images without the registry, whether " + FeatureGate + " is on or off"},
		{NeverVerify, Starts, "whether " + FeatureGate + " is on or off"},
	} {
		t.Run(c.policy, func(t *testing.T) {
			v, err := NewVerification(Config{ImagePullCredentialsVerificationPolicy: c.policy, PreloadedImagesVerificationAllowlist: []string{"other.example/*"}}, PullRecords{}, Version{})
			if err != nil {
				t.Fatal(err)
			}
			d := v.Decide([]string{app}, nil)
			if d.Answer != c.answer || !strings.Contains(d.Message, c.msg) {
				t.Fatalf("%v %q, want %v containing %q", d.Answer, d.Message, c.answer, c.msg)
			}
		})
	}
}

// The Reader runs the version source only when the config and the records do not say,
// and the config's explicit false wins.
func TestReaderDecidesFromTheVersion(t *testing.T) {
	const app = "reg.example/team/app@sha256:1111111111111111111111111111111111111111111111111111111111111111"
	v135 := Version{Major: 1, Minor: 35, Text: "v1.35.4", From: "fake"}
	for _, c := range []struct {
		name    string
		config  string
		records bool
		version Version
		answer  Answer
		runs    int
	}{
		{"AlwaysVerify, kubelet 1.35 not started yet", "imagePullCredentialsVerificationPolicy: AlwaysVerify\n", false, v135, NeedsRegistry, 1},
		{"AlwaysVerify, kubelet 1.34", "imagePullCredentialsVerificationPolicy: AlwaysVerify\n", false, Version{Major: 1, Minor: 34, Text: "v1.34.2", From: "fake"}, Starts, 1},
		{"AlwaysVerify, version not known", "imagePullCredentialsVerificationPolicy: AlwaysVerify\n", false, Version{From: "fake: no such file"}, Unknown, 1},
		{"explicit false wins", "imagePullCredentialsVerificationPolicy: AlwaysVerify\nfeatureGates: {KubeletEnsureSecretPulledImages: false}\n", false, v135, Starts, 0},
		{"records say, no run", "imagePullCredentialsVerificationPolicy: AlwaysVerify\n", true, Version{}, NeedsRegistry, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "kubelet.conf")
			write(t, file, header+c.config)
			root := filepath.Join(dir, "root")
			if c.records {
				if err := os.MkdirAll(filepath.Join(root, "image_manager"), 0o700); err != nil {
					t.Fatal(err)
				}
			}
			runs := 0
			r := Reader{ConfigFile: file, RootDir: root, Version: VersionFunc(func() Version { runs++; return c.version })}
			v, err := r.Read()
			if err != nil {
				t.Fatal(err)
			}
			if d := v.Decide([]string{app}, nil); d.Answer != c.answer {
				t.Errorf("answer %v, want %v: %s", d.Answer, c.answer, d.Message)
			}
			if runs != c.runs {
				t.Errorf("version read %d times, want %d", runs, c.runs)
			}
		})
	}
}

func TestParseVersion(t *testing.T) {
	for out, want := range map[string]string{
		"Kubernetes v1.35.4\n":        "v1.35.4",
		"Kubernetes v1.35.4+rke2r1\n": "v1.35.4+rke2r1",
		"Kubernetes v1.36.0-alpha.1":  "v1.36.0-alpha.1",
		"Kubernetes v1.9.11\n":        "v1.9.11",
	} {
		v, err := ParseVersion(out)
		if err != nil || v.Text != want {
			t.Errorf("%q: %+v %v, want %s", out, v, err, want)
		}
	}
	if v, _ := ParseVersion("Kubernetes v1.35.4"); v.Major != 1 || v.Minor != 35 {
		t.Errorf("%+v", v)
	}
	for _, bad := range []string{"", "v1.35.4", "kubelet version 1.35", "Kubernetes v1.x.4"} {
		if _, err := ParseVersion(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// fakeKubelet writes a script that counts its runs in a file beside it and then runs
// body.
func fakeKubelet(t *testing.T, body string) (path string, runs func() int) {
	dir := t.TempDir()
	path = filepath.Join(dir, "kubelet")
	count := filepath.Join(dir, "runs")
	if err := os.WriteFile(path, []byte("#!/bin/sh\necho run >> "+count+"\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, func() int {
		data, _ := os.ReadFile(count)
		return strings.Count(string(data), "run\n")
	}
}

// A fake kubelet binary: its --version is read, kept while the binary's mtime stays, read
// again when it changes.
func TestBinaryVersion(t *testing.T) {
	path, runs := fakeKubelet(t, `[ "$1" = --version ] && echo "Kubernetes v1.35.4"`)
	b := NewBinary(path)
	v := b.KubeletVersion()
	if v.Text != "v1.35.4" || v.Minor != 35 || v.From != path+" --version" {
		t.Fatalf("%+v", v)
	}
	if v := b.KubeletVersion(); v.Text != "v1.35.4" || runs() != 1 {
		t.Fatalf("second read %+v, %d runs (want the cached answer)", v, runs())
	}
	if err := os.WriteFile(path, []byte("#!/bin/sh\necho 'Kubernetes v1.36.1'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	if v := b.KubeletVersion(); v.Text != "v1.36.1" {
		t.Fatalf("after the binary changed: %+v", v)
	}
}

// What cannot be read is not known, with why: no binary (not run), not a kubelet, a
// binary that hangs (bounded by the timeout, output or not), a flood of output (capped).
// A failure is kept for RetryAfter, then tried again.
func TestBinaryVersionFailures(t *testing.T) {
	missing := NewBinary(filepath.Join(t.TempDir(), "kubelet"))
	if v := missing.KubeletVersion(); v.Known() || !strings.Contains(v.From, "no such file") {
		t.Fatalf("missing: %+v", v)
	}

	path, runs := fakeKubelet(t, "echo 'not a kubelet'; exit 2")
	now := time.Now()
	b := NewBinary(path)
	b.Now = func() time.Time { return now }
	if v := b.KubeletVersion(); v.Known() || !strings.Contains(v.From, "not a kubelet") {
		t.Fatalf("not a kubelet: %+v", v)
	}
	b.KubeletVersion()
	if runs() != 1 {
		t.Fatalf("%d runs, want the failure kept", runs())
	}
	now = now.Add(b.RetryAfter)
	b.KubeletVersion()
	if runs() != 2 {
		t.Fatalf("%d runs, want a retry after RetryAfter", runs())
	}

	hang, _ := fakeKubelet(t, "sleep 3 & sleep 3")
	h := NewBinary(hang)
	h.Timeout = 200 * time.Millisecond
	start := time.Now()
	if v := h.KubeletVersion(); v.Known() || !strings.Contains(v.From, "no answer within") {
		t.Fatalf("hang: %+v", v)
	}
	if d := time.Since(start); d > 2500*time.Millisecond {
		t.Fatalf("a hanging binary held the read %s", d)
	}

	flood, _ := fakeKubelet(t, `echo "Kubernetes v1.35.4"; head -c 10000000 /dev/zero`)
	f := NewBinary(flood)
	v := f.KubeletVersion()
	if v.Text != "v1.35.4" {
		t.Fatalf("flood: %+v", v)
	}
}

// Nothing is called Starts without being decided so: the zero Answer is Unknown, and a
// Verification not made by NewVerification answers Unknown.
func TestZeroValuesAreUnknown(t *testing.T) {
	var a Answer
	if a != Unknown {
		t.Fatalf("zero Answer %v", a)
	}
	if d := (Verification{}).Decide([]string{"reg.example/a:1"}, nil); d.Answer != Unknown {
		t.Fatalf("zero Verification: %+v", d)
	}
}

// The Reader reads the version also where the gate is decided but the kubelet's naming
// decides the answer (Kubernetes 1.36 names images differently: a record of its own
// pull, an allowlist), and not where nothing depends on it.
func TestReaderReadsTheVersionForTheNaming(t *testing.T) {
	const busybox = "docker.io/busybox@sha256:1111111111111111111111111111111111111111111111111111111111111111"
	for _, c := range []struct {
		name    string
		config  string
		records bool
		answer  Answer
		runs    int
	}{
		{"a record of the kubelet's pull", "", true, Starts, 1},
		{"an allowlist", "imagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages\npreloadedImagesVerificationAllowlist: [docker.io/busybox]\nfeatureGates: {KubeletEnsureSecretPulledImages: true}\n", false, Starts, 1},
		{"NeverVerify", "imagePullCredentialsVerificationPolicy: NeverVerify\n", true, Starts, 0},
		{"gate off", "featureGates: {KubeletEnsureSecretPulledImages: false}\n", true, Starts, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "kubelet.conf")
			write(t, file, header+c.config)
			root := filepath.Join(dir, "root")
			if c.records {
				pulled(t, root, "id-busybox", `,"credentialMapping":{"docker.io/busybox":{"nodePodsAccessible":true}}`)
			}
			runs := 0
			r := Reader{ConfigFile: file, RootDir: root, Version: VersionFunc(func() Version { runs++; return v136 })}
			v, err := r.Read()
			if err != nil {
				t.Fatal(err)
			}
			if d := v.Decide([]string{busybox}, map[string]string{busybox: "id-busybox"}); d.Answer != c.answer {
				t.Errorf("answer %v, want %v: %s", d.Answer, c.answer, d.Message)
			}
			if runs != c.runs {
				t.Errorf("version read %d times, want %d", runs, c.runs)
			}
		})
	}
}
