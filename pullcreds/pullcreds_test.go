package pullcreds

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

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

func TestSecretFileAbsentOrBroken(t *testing.T) {
	img := "quay.io/x/y@sha256:" + strings.Repeat("a", 64)
	for _, path := range []string{"", filepath.Join(t.TempDir(), "none.json")} {
		f := &SecretFile{Path: path}
		k, err := f.Reload()
		if err != nil || k.Len() != 0 || k.Lookup(img) != nil || f.Lookup(img) != nil {
			t.Fatalf("%q: %v %v", path, k, err)
		}
	}
	p := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(p, []byte(`{"auths": "hunter2`), 0o600)
	_, err := (&SecretFile{Path: p}).Reload()
	if err == nil || !strings.Contains(err.Error(), p) || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("a broken pull secret is an error naming the file, never quoting it: %v", err)
	}
}

// The file is read again when it changes; a broken file keeps the last good keyring,
// for Lookup and Reload alike.
func TestSecretFileFollowsTheFile(t *testing.T) {
	img := "quay.io/x/y@sha256:" + strings.Repeat("a", 64)
	p := filepath.Join(t.TempDir(), "config.json")
	write := func(content string, at time.Time) {
		t.Helper()
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	write(`{"auths": {"quay.io": {"username": "one", "password": "x"}}}`, now)
	f := &SecretFile{Path: p}
	if a := f.Lookup(img); a == nil || a.Username != "one" {
		t.Fatalf("first read: %+v", a)
	}
	write(`{"auths": {"quay.io": {"username": "two", "password": "x"}}}`, now.Add(time.Second))
	if a := f.Lookup(img); a == nil || a.Username != "two" {
		t.Fatalf("after a change: %+v", a)
	}
	write(`{"auths": "broken`, now.Add(2*time.Second))
	if a := f.Lookup(img); a == nil || a.Username != "two" {
		t.Fatalf("a broken file keeps the last good keyring: %+v", a)
	}
	k, err := f.Reload()
	if err == nil || k.Lookup(img) == nil || k.Lookup(img).Username != "two" {
		t.Fatalf("Reload of a broken file: %v, %v", k, err)
	}
	// Reload reads even an unchanged stamp: the same size and mtime, new content.
	write(`{"auths": {"quay.io": {"username": "six", "password": "x"}}}`, now.Add(3*time.Second))
	f.Lookup(img)
	write(`{"auths": {"quay.io": {"username": "ten", "password": "x"}}}`, now.Add(3*time.Second))
	if k, err := f.Reload(); err != nil || k.Lookup(img).Username != "ten" || f.Lookup(img).Username != "ten" {
		t.Fatalf("Reload: %v, %v", k, err)
	}
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
