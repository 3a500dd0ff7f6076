//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
	"github.com/imagepin/imagepin/test/testcerts"
)

// With [peers] on, a real containerd 2.2.9 keeps reaching TLS registries as the
// administrator configured it while imagepind's block is in their hosts.toml files, and
// with [peers] off the files are back as they were:
//   - certs: a registry directory holding only ca.crt (containerd reads such files only
//     while there is no hosts.toml);
//   - default: no directory of its own, _default/hosts.toml with a relative ca;
//   - secret: a hosts.toml of mode 0600 with a header, owned by another user;
//   - broken: a hosts.toml that does not parse (containerd falls back to the ca.crt beside
//     it), left as it is with a fault.
//
// Each registry is reached by a name (containerd skips certificate checks for loopback
// addresses and "localhost"), serves one pinned image and one that is not pinned: the
// mirror does not answer for the latter, so its pull shows the registry's own TLS works.
func TestContainerdHostsKeptAsTheAdministratorHadThem(t *testing.T) {
	start := time.Now()
	host, ip := loopbackName(t)
	w := newContainerdWorld(t, nil)
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "registries-ca")
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(ca.File)
	cert := servingCert(t, ca, host)
	hosts := w.ctr.HostsDir
	regs := map[string]string{} // role → host:port
	for _, role := range []string{"certs", "default", "secret", "broken"} {
		regs[role] = startTLSRegistry(t, ip, host, cert)
	}
	dirOf := func(r string) string { return filepath.Join(hosts, strings.Replace(r, ":", "_", 1)+"_") }
	write := func(file string, b []byte, mode os.FileMode) {
		t.Helper()
		os.MkdirAll(filepath.Dir(file), 0o755)
		if err := os.WriteFile(file, b, mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(file, mode)
	}
	write(filepath.Join(dirOf(regs["certs"]), "ca.crt"), caPEM, 0o644)
	write(filepath.Join(hosts, "_default", "ca.crt"), caPEM, 0o644)
	write(filepath.Join(hosts, "_default", "hosts.toml"), []byte("# every registry without its own directory\nca = \"ca.crt\"\n"), 0o644)
	secret := filepath.Join(dirOf(regs["secret"]), "hosts.toml")
	write(filepath.Join(dirOf(regs["secret"]), "registry-ca.pem"), caPEM, 0o644)
	write(secret, fmt.Appendf(nil, "server = \"https://%s\"\nca = \"registry-ca.pem\"\n\n[header]\n  Authorization = \"Bearer not-a-real-token\"\n", regs["secret"]), 0o600)
	if err := os.Chown(secret, 4321, 4321); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(dirOf(regs["broken"]), "ca.crt"), caPEM, 0o644)
	write(filepath.Join(dirOf(regs["broken"]), "hosts.toml"), []byte("server = [\n"), 0o644)
	before := snapshot(t, hosts)

	var pinned, others []string
	for _, role := range []string{"certs", "default", "secret", "broken"} {
		pinned = append(pinned, pushTLS(t, ca, regs[role], role+"-pinned"))
		others = append(others, pushTLS(t, ca, regs[role], role+"-other"))
	}
	mport, err := env.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	w.writeConfig(worldOptions{extra: fmt.Sprintf("[peers]\nenabled = true\nmirror_address = \"127.0.0.1:%d\"\n", mport)})
	w.startDaemon()
	w.writeSet("tls.yaml", alphaSet("tls", pinned...))
	n := w.waitFor("tls Ready with [peers] on", 90*time.Second, phaseIs("tls", status.Ready))
	// The one fault is the broken file's: the certs.d-only registry, the one through
	// _default with a relative ca and the 0600 file take the block as they are, and
	// imagepind says nothing is wrong with them.
	t.Logf("faults with [peers] on: %q", n.Faults)
	broken := filepath.Base(dirOf(regs["broken"])) + "/hosts.toml"
	// The 0600 file's header is not sent by imagepind's own registry access, which, with
	// [peers] on, now also fetches the pinned images' blobs the node keeps: that is said,
	// naming the file, and nothing else of it.
	header := filepath.Base(dirOf(regs["secret"])) + "/hosts.toml: server sets header"
	var kept []string
	for _, f := range n.Faults {
		if !strings.Contains(f, header) {
			kept = append(kept, f)
		}
	}
	for _, f := range kept {
		if !strings.Contains(f, broken) {
			t.Fatalf("a fault other than the broken hosts.toml's: %q (all: %q)", f, n.Faults)
		}
	}
	for role, names := range map[string][]string{
		"certs":   {regs["certs"] + ":", filepath.Base(dirOf(regs["certs"])) + "/"},
		"default": {regs["default"] + ":", regs["default"] + "/", "_default/"},
		"secret":  {regs["secret"] + ":", filepath.Base(dirOf(regs["secret"])) + "/"},
	} {
		for _, named := range names {
			if f := faultNaming(kept, named); f != "" {
				t.Fatalf("the %s registry (%s) has a fault: %q", role, regs[role], f)
			}
		}
	}
	for _, r := range pinned {
		if !w.labelled(r) {
			t.Fatalf("%s is not pinned (labelled)", r)
		}
	}
	// The block is in every registry's file but the broken one's, which has a fault.
	for _, role := range []string{"certs", "default", "secret"} {
		file := filepath.Join(hosts, strings.Replace(regs[role], ":", "_", 1)+"_", "hosts.toml")
		if role == "default" {
			file = filepath.Join(hosts, regs[role], "hosts.toml") // a new directory, host:port
		}
		b, err := os.ReadFile(file)
		if err != nil || !bytes.Contains(b, []byte("# >>> imagepin")) || !bytes.Contains(b, []byte(`capabilities = ["pull"]`)) {
			t.Fatalf("%s: %v\n%s", file, err, b)
		}
		t.Logf("%s (%s):\n%s", role, file, b)
	}
	fi, _ := os.Stat(secret)
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o600 || st.Uid != 4321 || st.Gid != 4321 {
		t.Fatalf("the 0600 hosts.toml became %v %d:%d", fi.Mode(), st.Uid, st.Gid)
	}
	if b, _ := os.ReadFile(filepath.Join(dirOf(regs["broken"]), "hosts.toml")); string(b) != "server = [\n" {
		t.Fatalf("the broken file was changed:\n%s", b)
	}
	faults := strings.Join(n.Faults, "\n")
	if !strings.Contains(faults, filepath.Base(dirOf(regs["broken"]))+"/hosts.toml does not parse") {
		t.Fatalf("no fault names the broken hosts.toml: %q", n.Faults)
	}
	// Images the mirror does not answer for come from the registries, over their TLS.
	pullAll(t, w, others)

	// [peers] off: the files are back as the administrator had them, and pulls work.
	w.stopDaemon()
	os.Remove(w.status) // Ready below is the new run's
	w.writeConfig(worldOptions{})
	w.startDaemon()
	n = w.waitFor("tls Ready with [peers] off", 60*time.Second, phaseIs("tls", status.Ready))
	if len(n.Faults) != 0 {
		t.Fatalf("faults with [peers] off (no block is written, none is left to fail): %q", n.Faults)
	}
	if _, err := os.Stat(filepath.Join(w.dir, "state", "containerd-mirror-hosts.json")); !os.IsNotExist(err) {
		t.Fatalf("imagepind's record of the files it gave a block is still there: %v", err)
	}
	if after := snapshot(t, hosts); after != before {
		t.Fatalf("the hosts directory after [peers] off:\n%s\nwant, as the administrator had it:\n%s", after, before)
	}
	crictl := filepath.Join(env.CacheDir(), "crictl")
	for _, r := range others {
		if out, err := exec.Command(crictl, "--runtime-endpoint", "unix://"+w.socket(), "rmi", r).CombinedOutput(); err != nil {
			t.Fatalf("crictl rmi: %v %s", err, out)
		}
	}
	pullAll(t, w, others)
	t.Logf("took %s", time.Since(start).Round(time.Millisecond))
}

// A registry with no directory of its own while _default holds only certificate files
// (a ca.crt, no hosts.toml): containerd 2.2.9 reads them for every such registry, and
// stops once the registry has a hosts.toml. With [peers] on, the file imagepind makes
// for the registry names _default's ca.crt, so the set becomes Ready through the mirror
// (whose fill reads the same file), no fault is raised, and an image the mirror does not
// answer for comes from the registry over its TLS. With [peers] off the hosts directory is
// back as it was, and pulls still work.
func TestContainerdHostsDefaultWithOnlyCertificateFiles(t *testing.T) {
	start := time.Now()
	host, ip := loopbackName(t)
	w := newContainerdWorld(t, nil)
	ca, err := testcerts.NewCA(t.TempDir(), "registries-ca")
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(ca.File)
	reg := startTLSRegistry(t, ip, host, servingCert(t, ca, host))
	hosts := w.ctr.HostsDir
	defaultCA := filepath.Join(hosts, "_default", "ca.crt")
	os.MkdirAll(filepath.Dir(defaultCA), 0o755)
	if err := os.WriteFile(defaultCA, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, hosts)
	pinned := pushTLS(t, ca, reg, "default-certs-pinned")
	other := pushTLS(t, ca, reg, "default-certs-other")
	mport, err := env.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	w.writeConfig(worldOptions{extra: fmt.Sprintf("[peers]\nenabled = true\nmirror_address = \"127.0.0.1:%d\"\n", mport)})
	w.startDaemon()
	w.writeSet("tls.yaml", alphaSet("tls", pinned))
	n := w.waitFor("tls Ready with [peers] on", 90*time.Second, phaseIs("tls", status.Ready))
	if len(n.Faults) != 0 {
		t.Fatalf("faults with [peers] on and _default holding only a ca.crt: %q", n.Faults)
	}
	if !w.labelled(pinned) {
		t.Fatalf("%s is not pinned (labelled)", pinned)
	}
	file := filepath.Join(hosts, reg, "hosts.toml") // a new directory, host:port
	b, err := os.ReadFile(file)
	if err != nil || !bytes.HasPrefix(b, []byte("# imagepin: imagepind made this file and its directory from _default")) ||
		!bytes.Contains(b, fmt.Appendf(nil, "ca = [%q]", defaultCA)) || !bytes.Contains(b, []byte(`capabilities = ["pull"]`)) {
		t.Fatalf("%s: %v\n%s", file, err, b)
	}
	t.Logf("%s:\n%s", file, b)
	pullAll(t, w, []string{other})

	w.stopDaemon()
	os.Remove(w.status) // Ready below is the new run's
	w.writeConfig(worldOptions{})
	w.startDaemon()
	n = w.waitFor("tls Ready with [peers] off", 60*time.Second, phaseIs("tls", status.Ready))
	if len(n.Faults) != 0 {
		t.Fatalf("faults with [peers] off: %q", n.Faults)
	}
	if after := snapshot(t, hosts); after != before {
		t.Fatalf("the hosts directory after [peers] off:\n%s\nwant, as the administrator had it:\n%s", after, before)
	}
	crictl := filepath.Join(env.CacheDir(), "crictl")
	if out, err := exec.Command(crictl, "--runtime-endpoint", "unix://"+w.socket(), "rmi", other).CombinedOutput(); err != nil {
		t.Fatalf("crictl rmi: %v %s", err, out)
	}
	pullAll(t, w, []string{other})
	t.Logf("took %s", time.Since(start).Round(time.Millisecond))
}

// While imagepind is down, any local process may bind the node-local mirror's
// (unprivileged) port. The mirror's host in hosts.toml has capabilities = ["pull"] only,
// so containerd 2.2.9 never asks it what a tag means (a tag needs resolve,
// core/remotes/docker/resolver.go Resolve): an impostor there cannot choose the image
// behind a tag for any repository of a pinned registry. The impostor serves a whole
// image B of its choosing, manifest and blobs; the tag names image A at the registry.
//   - pull-only (imagepind's block, as written): the tag is A, and the impostor is
//     asked for digests (A's, which it refuses with 404) but never for a tag;
//   - the same block with "resolve" added, in a scratch copy under another registry
//     name: the impostor is asked for the tag and B is what the tag becomes (the
//     test can fail);
//   - an impostor answering every request with B's manifest: still no tag request and
//     never B, but the pull fails (containerd refuses the wrong bytes by digest and does
//     not go on to the next host after a 200): it can deny, not choose.
func TestContainerdHostsImpostorOnTheMirrorPortCannotChooseATag(t *testing.T) {
	start := time.Now()
	w := newContainerdWorld(t, nil)
	ctx := t.Context()
	reg := w.reg.Host
	pinned := w.push("pinned", 1)
	a, err := w.reg.PushRandom(ctx, "tagged", 1, 64<<10) // tagged:latest is A
	if err != nil {
		t.Fatal(err)
	}
	a2, err := w.reg.PushRandom(ctx, "tagged-every", 1, 64<<10) // tagged-every:latest is A2
	if err != nil {
		t.Fatal(err)
	}
	b, err := w.reg.PushRandom(ctx, "impostor-b", 1, 64<<10) // the impostor's image
	if err != nil {
		t.Fatal(err)
	}
	mport, err := env.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	mirror := fmt.Sprintf("127.0.0.1:%d", mport)
	w.writeConfig(worldOptions{extra: fmt.Sprintf("[peers]\nenabled = true\nmirror_address = %q\n", mirror)})
	w.startDaemon()
	w.writeSet("pinned.yaml", alphaSet("pinned", pinned...))
	w.waitFor("pinned Ready with [peers] on", 90*time.Second, phaseIs("pinned", status.Ready))
	file := filepath.Join(w.ctr.HostsDir, strings.Replace(reg, ":", "_", 1)+"_", "hosts.toml")
	block, err := os.ReadFile(file)
	if err != nil || !bytes.Contains(block, []byte("# >>> imagepin")) || !bytes.Contains(block, []byte(`[host."http://`+mirror+"/v2/")) ||
		!bytes.Contains(block, []byte(`capabilities = ["pull"]`)) {
		t.Fatalf("%s: %v\n%s", file, err, block)
	}
	t.Logf("%s with the block:\n%s", file, block)

	// imagepind stopped: its block stays (only [peers] off takes it out), and its port is
	// free for whoever binds it first.
	w.stopDaemon()
	if after, _ := os.ReadFile(file); !bytes.Equal(after, block) {
		t.Fatalf("%s changed when imagepind stopped:\n%s", file, after)
	}
	im := startImpostor(t, mirror, b.Ref())
	pull := func(ref string) error {
		t.Helper()
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_, err := w.cri.PullImage(pctx, ref, nil)
		return err
	}

	// 1. Pull-only, as imagepind wrote it: the tag is resolved at the registry.
	tag := reg + "/tagged:latest"
	if err := pull(tag); err != nil {
		t.Fatalf("pull %s with the impostor on the mirror's port: %v\ncontainerd log:\n%s", tag, err, w.ctr.LogTail(30))
	}
	seen, reqs := im.counts()
	got := recordTarget(t, w.ctr.Socket, tag)
	t.Logf("pull-only: %s became %s (A is %s, the impostor's B %s); the impostor saw %+v:\n  %s",
		tag, got, a.Digest, b.Digest, seen, strings.Join(reqs, "\n  "))
	if got != a.Digest {
		t.Fatalf("%s is %s, want A %s (the impostor's B is %s)", tag, got, a.Digest, b.Digest)
	}
	if seen.TagManifests != 0 {
		t.Fatalf("the impostor was asked for a tag %d times: %v", seen.TagManifests, reqs)
	}
	// It was first in line for everything by digest (A's manifest, config and layer),
	// refused each with a 404, and containerd went on to the registry: the block is live.
	if seen.DigestManifests == 0 || seen.Blobs == 0 {
		t.Fatalf("the impostor saw %+v: containerd never went to the mirror's host at all, so this test proves nothing", seen)
	}

	// 2. The same file with "resolve" added to the mirror's host, in a scratch copy that
	// containerd reads for another name of the same registry: the impostor is asked for
	// the tag, and its B is what the tag becomes.
	const scratch = "resolve-variant.example.invalid"
	withResolve := bytes.Replace(block, []byte("capabilities = [\"pull\"]\n  override_path"), []byte("capabilities = [\"pull\", \"resolve\"]\n  override_path"), 1)
	if bytes.Equal(withResolve, block) {
		t.Fatalf("no mirror host to add resolve to in:\n%s", block)
	}
	if err := w.ctr.WriteHosts(scratch, string(withResolve)); err != nil {
		t.Fatal(err)
	}
	im.setSmart(true)
	if err := pull(scratch + "/tagged:latest"); err != nil {
		t.Fatalf("pull through the resolve variant: %v\ncontainerd log:\n%s", err, w.ctr.LogTail(30))
	}
	seen, reqs = im.counts()
	got = recordTarget(t, w.ctr.Socket, scratch+"/tagged:latest")
	t.Logf("with resolve: %s/tagged:latest became %s (B); the impostor saw %+v:\n  %s", scratch, got, seen, strings.Join(reqs, "\n  "))
	if got != b.Digest || seen.TagManifests == 0 {
		t.Fatalf("with resolve on the mirror's host the tag became %s (A %s, B %s) and the impostor saw %d tag requests: the variant should have let the impostor choose",
			got, a.Digest, b.Digest, seen.TagManifests)
	}
	os.RemoveAll(filepath.Join(w.ctr.HostsDir, scratch))

	// 3. An impostor answering every request, digests and blobs included, with B's
	// manifest: containerd still never asks it for the tag (A2 comes from the registry's
	// answer), and fetches A2's manifest by digest from it first. The bytes it gets are
	// B's, and containerd's content store refuses them at commit ("unexpected commit
	// digest"): containerd goes on to the next host only when a host fails to answer
	// (an error or a 404), not when a 200's bytes are wrong, so the pull fails. An
	// impostor can fail pulls from a pinned registry while imagepind is down; it cannot
	// make a tag mean another image.
	im.setSmart(false)
	every := reg + "/tagged-every:latest"
	err = pull(every)
	seen, reqs = im.counts()
	t.Logf("every request answered with B: pull %s: %v; the impostor saw %+v:\n  %s", every, err, seen, strings.Join(reqs, "\n  "))
	if seen.TagManifests != 0 {
		t.Fatalf("the impostor was asked for a tag %d times: %v", seen.TagManifests, reqs)
	}
	if got := recordTarget(t, w.ctr.Socket, every); got == b.Digest {
		t.Fatalf("%s became the impostor's B", every)
	}
	if err == nil || !strings.Contains(err.Error(), "unexpected commit digest") || seen.DigestManifests == 0 {
		t.Fatalf("pull %s with every request answered by B's manifest: %v (impostor saw %+v); want the digest refused at commit", every, err, seen)
	}

	// The refused bytes stay behind: containerd keeps the failed ingest (B's bytes under
	// A2's manifest ref) until its garbage collection removes it, which on a loaded
	// machine was seen to take more than a minute, and a pull in between resumes that
	// ingest, already complete, and fails the same way without asking any host. An
	// administrator clears it with "ctr -n k8s.io content active" and an abort; the test
	// does the same through containerd's content API, so that what follows is about the
	// network alone.
	im.close()
	if n := abortIngests(t, w.ctr.Socket); n == 0 {
		t.Logf("no ingest left by the refused pull (containerd had already collected it)")
	} else {
		t.Logf("%d ingest(s) left by the refused pull, aborted", n)
	}

	// The impostor gone and imagepind back: its mirror answers 404 for what is not
	// pinned, and the same pull comes from the registry, A2.
	os.Remove(w.status)
	w.startDaemon()
	w.waitFor("pinned Ready again", 60*time.Second, phaseIs("pinned", status.Ready))
	if err := pull(every); err != nil {
		t.Fatalf("pull %s with imagepind back: %v\ncontainerd log:\n%s", every, err, w.ctr.LogTail(30))
	}
	if got := recordTarget(t, w.ctr.Socket, every); got != a2.Digest {
		t.Fatalf("%s is %s, want A2 %s", every, got, a2.Digest)
	}
	t.Logf("took %s", time.Since(start).Round(time.Millisecond))
}

// A registry whose hosts.toml is a symbolic link (to a file outside the hosts directory,
// one several registries may share) is left as it is with [peers] on: the link and its
// target unchanged, a fault naming the file, and the set Ready, its images pulled through
// the administrator's file as containerd reads it through the link (the registry's name
// does not resolve: only the linked file's server reaches it). A registry with a regular
// hosts.toml beside it gets the block.
func TestContainerdHostsLinkedFileLeftAlone(t *testing.T) {
	start := time.Now()
	w := newContainerdWorld(t, nil)
	reg := w.reg.Host
	const linked = "linked.example.invalid"
	shared := filepath.Join(w.dir, "shared-hosts", "registries.toml")
	content := fmt.Sprintf("# shared by the lab's registry names\nserver = \"http://%[1]s\"\n\n[host.\"http://%[1]s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", reg)
	os.MkdirAll(filepath.Dir(shared), 0o755)
	if err := os.WriteFile(shared, []byte(content), 0o640); err != nil {
		t.Fatal(err)
	}
	linkDir := filepath.Join(w.ctr.HostsDir, linked)
	os.MkdirAll(linkDir, 0o755)
	link := filepath.Join(linkDir, "hosts.toml")
	if err := os.Symlink(shared, link); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, linkDir) + snapshot(t, filepath.Dir(shared))

	var linkedRefs []string
	for _, r := range w.push("linked", 2) {
		linkedRefs = append(linkedRefs, strings.Replace(r, reg, linked, 1))
	}
	own := w.push("own", 1)
	mport, err := env.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	w.writeConfig(worldOptions{extra: fmt.Sprintf("[peers]\nenabled = true\nmirror_address = \"127.0.0.1:%d\"\n", mport)})
	w.startDaemon()
	all := append(slices.Clone(linkedRefs), own...)
	w.writeSet("linked.yaml", alphaSet("linked", all...))
	want := linked + "/hosts.toml is a symbolic link (to " + shared + ")"
	n := w.waitFor("linked Ready with a fault naming the link", 90*time.Second, func(n status.Node) bool {
		return phaseIs("linked", status.Ready)(n) && strings.Contains(strings.Join(n.Faults, "\n"), want)
	})
	t.Logf("faults: %q", n.Faults)
	for _, r := range all {
		if img := w.image(r); !img.Present || !w.labelled(r) {
			t.Fatalf("%s: present=%v labelled=%v", r, img.Present, w.labelled(r))
		}
	}
	fi, err := os.Lstat(link)
	if err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("%s is no longer a link: %v %v", link, fi.Mode(), err)
	}
	if target, _ := os.Readlink(link); target != shared {
		t.Fatalf("%s now links to %s, want %s", link, target, shared)
	}
	if after := snapshot(t, linkDir) + snapshot(t, filepath.Dir(shared)); after != before {
		t.Fatalf("the linked registry's directory and the shared file:\n%s\nwant, as the administrator had them:\n%s", after, before)
	}
	// The registry's own (regular) hosts.toml got the block: [peers] was in effect.
	ownFile := filepath.Join(w.ctr.HostsDir, strings.Replace(reg, ":", "_", 1)+"_", "hosts.toml")
	if b, _ := os.ReadFile(ownFile); !bytes.Contains(b, []byte("# >>> imagepin")) {
		t.Fatalf("%s has no block:\n%s", ownFile, b)
	}
	t.Logf("took %s", time.Since(start).Round(time.Millisecond))
}

// faultNaming is the first of faults that contains s, or "".
func faultNaming(faults []string, s string) string {
	for _, f := range faults {
		if strings.Contains(f, s) {
			return f
		}
	}
	return ""
}

// pullAll pulls refs through CRI, as the kubelet does.
func pullAll(t *testing.T, w *world, refs []string) {
	t.Helper()
	for _, r := range refs {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		_, err := w.cri.PullImage(ctx, r, nil)
		cancel()
		if err != nil {
			t.Fatalf("pull %s: %v\ncontainerd log:\n%s", r, err, w.ctr.LogTail(20))
		}
	}
}

// snapshot lists every file and directory under root with its mode, owner and content.
func snapshot(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		fmt.Fprintf(&b, "%s %v %d:%d", strings.TrimPrefix(p, root), fi.Mode(), st.Uid, st.Gid)
		if fi.Mode().IsRegular() {
			c, _ := os.ReadFile(p)
			fmt.Fprintf(&b, " %q", c)
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// loopbackName is a name other than localhost that resolves to a loopback address, and
// that address: one /etc/hosts already has, else one the test adds to it and takes out
// again at its end.
func loopbackName(t *testing.T) (string, string) {
	t.Helper()
	orig, err := os.ReadFile("/etc/hosts")
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(orig))
	for sc.Scan() {
		f := strings.Fields(strings.SplitN(sc.Text(), "#", 2)[0])
		if len(f) < 2 || net.ParseIP(f[0]) == nil || !net.ParseIP(f[0]).IsLoopback() || net.ParseIP(f[0]).To4() == nil {
			continue
		}
		for _, h := range f[1:] {
			if h != "localhost" && !strings.HasSuffix(h, ".localhost") && !strings.Contains(h, "localhost") {
				if addrs, err := net.LookupHost(h); err == nil && len(addrs) > 0 && addrs[0] == f[0] {
					return h, f[0]
				}
			}
		}
	}
	const name = "imagepin-e2e-registry.test"
	add := append(bytes.Clone(orig), []byte("\n127.0.0.1 "+name+" # imagepin e2e, removed at the test's end\n")...)
	// In place: /etc/hosts may be a bind mount, which a rename would not replace.
	if err := os.WriteFile("/etc/hosts", add, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile("/etc/hosts", orig, 0o644); err != nil {
			t.Errorf("restore /etc/hosts: %v", err)
		}
	})
	return name, "127.0.0.1"
}

// servingCert is a serving certificate for host signed by ca.
func servingCert(t *testing.T, ca *testcerts.CA, host string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	c, err := tls.X509KeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startTLSRegistry serves a registry (go-containerregistry's, in memory) over TLS on
// ip, and returns it as host:port.
func startTLSRegistry(t *testing.T, ip, host string, cert tls.Certificate) string {
	t.Helper()
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	srv.Listener.Close()
	srv.Listener = l
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return fmt.Sprintf("%s:%d", host, l.Addr().(*net.TCPAddr).Port)
}

// pushTLS pushes a random image as reg/repo:latest and returns its digest reference.
func pushTLS(t *testing.T, ca *testcerts.CA, reg, repo string) string {
	t.Helper()
	img, err := random.Image(64<<10, 1)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	ref, err := name.ParseReference(reg + "/" + repo + ":latest")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithTransport(tr)); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	return reg + "/" + repo + "@" + d.String()
}
