package cri

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestClassify(t *testing.T) {
	cases := map[string]Failure{
		"reading manifest sha256:abc in 127.0.0.1:5000/x: manifest unknown":                                                                  Unavailable,
		"initializing source docker://q/x@sha256:1: requested access to the resource is denied":                                              Unavailable,
		"unauthorized: authentication required":                                                                                              Unavailable,
		`choosing image instance: no image found in manifest list for architecture "s390x"`:                                                  Unavailable,
		"pinging container registry 127.0.0.1:5999: Get \"http://127.0.0.1:5999/v2/\": dial tcp 127.0.0.1:5999: connect: connection refused": Transient,
		"received unexpected HTTP status: 503 Service Unavailable":                                                                           Transient,
		"writing blob: storing blob to file \"/var/tmp/x\": write /var/tmp/x: no space left on device":                                       NoSpace,
		"something nobody has seen": Transient,
		"(Mirrors also failed: [mirror.local/ocp/x@sha256:0: reading manifest sha256:0 in mirror.local/ocp/x: manifest unknown]): upstream.example.invalid/ocp/x@sha256:0: pinging container registry upstream.example.invalid: Get \"https://upstream.example.invalid/v2/\": dial tcp: lookup upstream.example.invalid: no such host": Unavailable,
		"(Mirrors also failed: [mirror.local/ocp/x@sha256:0: pinging container registry mirror.local: connection refused]): upstream.example.invalid/ocp/x@sha256:0: dial tcp: lookup upstream.example.invalid: no such host":                                                                                                          Transient,
	}
	for msg, want := range cases {
		if got := Classify(&PullError{Message: msg}); got != want {
			t.Errorf("Classify(%q) = %v, want %v", msg, got, want)
		}
	}
	if Classify(fmt.Errorf("pull x: %w: eof", ErrUnavailable)) != Transient {
		t.Error("runtime down must be transient")
	}
}

func TestKeyringLookup(t *testing.T) {
	data := `{"auths": {
	  "quay.io": {"auth": "` + b64("quay-user:quay-pass") + `"},
	  "quay.io/openshift-release-dev": {"username": "rel", "password": "relpass"},
	  "https://registry.example:5000/v2/": {"auth": "` + b64("ex:expass") + `"},
	  "*.mirror.example": {"auth": "` + b64("glob:globpass") + `"},
	  "https://index.docker.io/v1/": {"auth": "` + b64("hub:hubpass") + `"}
	}}`
	k, err := ParseKeyring([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	d := "@sha256:" + strings.Repeat("a", 64)
	cases := map[string]string{
		"quay.io/openshift-release-dev/ocp-release" + d: "rel",
		"quay.io/openshift-release-dev-other/x" + d:     "quay-user",
		"quay.io/other/x" + d:                           "quay-user",
		"registry.example:5000/v2x/y" + d:               "",
		"a.mirror.example/x/y" + d:                      "glob",
		"a.b.mirror.example/x" + d:                      "",
		"docker.io/library/busybox" + d:                 "hub",
		"ghcr.io/x/y" + d:                               "",
	}
	for img, want := range cases {
		a := k.Lookup(img)
		got := ""
		if a != nil {
			got = a.Username
		}
		if got != want {
			t.Errorf("Lookup(%s) user %q, want %q", img, got, want)
		}
	}
	// registry.example:5000/v2/ as a key means the host, path "v2": the kubelet keeps the path.
	if a := k.Lookup("registry.example:5000/v2/img" + d); a == nil || a.Password != "expass" {
		t.Errorf("path-prefixed key: %+v", a)
	}
}

func TestKeyringErrorsHideSecrets(t *testing.T) {
	_, err := ParseKeyring([]byte(`{"auths": {"quay.io": {"auth": "c2VjcmV0LXBhc3N3b3Jk!!"}}}`))
	if err == nil || strings.Contains(err.Error(), "c2VjcmV0") {
		t.Fatalf("error %v", err)
	}
	_, err = ParseKeyring([]byte(`{"auths": "supersecret`))
	if err == nil || strings.Contains(err.Error(), "supersecret") {
		t.Fatalf("error %v", err)
	}
}

func TestLoadKeyringAbsent(t *testing.T) {
	k, err := LoadKeyring(filepath.Join(t.TempDir(), "none.json"))
	if err != nil || k.Len() != 0 || k.Lookup("quay.io/x/y@sha256:"+strings.Repeat("a", 64)) != nil {
		t.Fatalf("%v %v", k, err)
	}
	p := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(p, []byte(`{"auths": "hunter2`), 0o600)
	_, err = LoadKeyring(p)
	if err == nil || !strings.Contains(err.Error(), p) || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("a broken pull secret is an error naming the file, never quoting it: %v", err)
	}
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
