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
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepin/imagepin/internal/testcerts"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
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
	w.waitFor("tls Ready with [peers] off", 60*time.Second, phaseIs("tls", status.Ready))
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
