package containerd

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/BurntSushi/toml"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// Hosts follows containerd's registry hosts directory (the CRI plugin's
// registry.config_path: <config_path>/<host>/hosts.toml, <host:port> spelled
// "<host>_<port>_" or "<host>:<port>", and _default/hosts.toml for the rest) for the
// disk check, which reaches registries through containers/image: each registry it is
// asked about is translated into a registries.conf entry (the hosts in file order as
// mirrors, then the server) and a certs.d-style directory (each host's ca and client
// files), generated under Dir. What containerd does and the translation cannot say is
// reported by Problems, and the disk check sizes images through the other endpoints.
type Hosts struct {
	// ConfigPath is containerd's hosts directory; Dir where the translation is written.
	ConfigPath string
	Dir        string
	// Skip is a host:port left out of the translation (the node-local mirror's, for
	// the mirror's own registry access).
	Skip string

	mu       sync.Mutex
	entries  map[string]hostEntry // by registry host
	conf     string               // the registries.conf written last
	prevConf string               // the one before, still in use by a caller perhaps
	problems map[string]string    // by registry host
}

type hostEntry struct {
	source string // the hosts.toml read ("" for containerd's default)
	stamp  string // its size and time, to notice a change
	text   string // the registries.conf entry
}

// endpoint is one host of a hosts.toml, as containerd reads it.
type endpoint struct {
	scheme, host, path string
	pull, resolve      bool
	skipVerify         bool
	ca                 []string
	client             [][2]string
}

type hostFields struct {
	Capabilities []string `toml:"capabilities"`
	CA           any      `toml:"ca"`
	Client       any      `toml:"client"`
	SkipVerify   *bool    `toml:"skip_verify"`
	Header       any      `toml:"header"`
	OverridePath bool     `toml:"override_path"`
	DialTimeout  string   `toml:"dial_timeout"`
}

// Files returns the registries.conf, an empty drop-in directory and the certs.d
// directory that reach image's registry as containerd would. A file that cannot be
// written leaves the previous one in use.
func (h *Hosts) Files(image string) (conf, confDir, certsDir string) {
	registry := image
	if i := strings.IndexByte(image, '/'); i >= 0 {
		registry = image[:i]
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.entries == nil {
		h.entries, h.problems = map[string]hostEntry{}, map[string]string{}
	}
	source, stamp := h.find(registry)
	old, ok := h.entries[registry]
	if !ok || old.source != source || old.stamp != stamp {
		text, problem := h.translate(registry, source)
		h.entries[registry] = hostEntry{source: source, stamp: stamp, text: text}
		if problem != "" {
			h.problems[registry] = problem
		} else {
			delete(h.problems, registry)
		}
		if err := h.write(); err != nil {
			h.problems["(imagepin)"] = "cannot write the translation of containerd's hosts: " + err.Error()
		}
	}
	return h.conf, filepath.Join(h.Dir, "registries.conf.d"), filepath.Join(h.Dir, "certs.d")
}

// Problems lists what the translation could not follow, one line per registry.
func (h *Hosts) Problems() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, p := range h.problems {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// find is the hosts directory containerd would use for registry (config_unix.go
// hostPaths) and a stamp of its hosts.toml; "" when there is none.
func (h *Hosts) find(registry string) (dir, stamp string) {
	if h.ConfigPath == "" {
		return "", ""
	}
	var candidates []string
	if i := strings.LastIndex(registry, ":"); i > 0 {
		candidates = append(candidates, filepath.Join(h.ConfigPath, registry[:i]+"_"+registry[i+1:]+"_"))
	}
	candidates = append(candidates, filepath.Join(h.ConfigPath, registry), filepath.Join(h.ConfigPath, "_default"))
	for _, d := range candidates {
		if _, err := os.Stat(d); err == nil {
			var st []string
			entries, _ := os.ReadDir(d)
			for _, e := range entries {
				if info, err := e.Info(); err == nil {
					st = append(st, fmt.Sprintf("%s:%d:%d", e.Name(), info.Size(), info.ModTime().UnixNano()))
				}
			}
			return d, strings.Join(st, ",")
		}
	}
	return "", ""
}

// translate is registry's registries.conf entry, and what it could not follow.
func (h *Hosts) translate(registry, dir string) (string, string) {
	var eps []endpoint
	var problems []string
	if dir != "" {
		var err error
		eps, problems, err = readHostDir(dir)
		if err != nil {
			// containerd falls back to the directory's certificate files too.
			problems = append(problems, fmt.Sprintf("%s does not parse (%v); containerd then uses the directory's certificate files, and so does the disk check", filepath.Join(dir, "hosts.toml"), err))
			eps = certFiles(dir)
		}
	}
	// The last endpoint is the server; without one, containerd's default for the host.
	if len(eps) == 0 || eps[len(eps)-1].host == "" {
		if len(eps) == 0 {
			eps = append(eps, endpoint{pull: true, resolve: true})
		}
		def := &eps[len(eps)-1]
		def.path = "/v2"
		switch {
		case registry == "docker.io":
			def.scheme, def.host = "https", "registry-1.docker.io"
		case isLocalhost(registry):
			def.host = registry
			if _, port, _ := net.SplitHostPort(registry); port == "" || port == "443" {
				def.scheme = "https"
			} else {
				def.scheme = "http"
			}
			def.skipVerify = true
		default:
			def.scheme, def.host = "https", registry
		}
	}
	var b strings.Builder
	server := eps[len(eps)-1]
	fmt.Fprintf(&b, "\n[[registry]]\nprefix = %q\nlocation = %q\ninsecure = %t\n", registry, server.host, server.insecure())
	if server.path != "/v2" {
		problems = append(problems, fmt.Sprintf("%s: server %s://%s%s has a path (override_path or a prefix) the disk check cannot follow; it asks %s/v2", registry, server.scheme, server.host, server.path, server.host))
	}
	if !server.pull {
		problems = append(problems, fmt.Sprintf("%s: the server has no pull capability, so containerd never pulls from it; the disk check still asks it last", registry))
	}
	for _, ep := range eps[:len(eps)-1] {
		if !ep.pull || (h.Skip != "" && ep.host == h.Skip) {
			continue
		}
		loc, ok := ep.location()
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: host %s://%s%s has a path (override_path or a prefix) the disk check cannot follow; it sizes images through the other hosts", registry, ep.scheme, ep.host, ep.path))
			continue
		}
		fmt.Fprintf(&b, "[[registry.mirror]]\nlocation = %q\ninsecure = %t\n", loc, ep.insecure())
		if !ep.resolve {
			b.WriteString("pull-from-mirror = \"digest-only\"\n")
		}
	}
	for _, ep := range eps {
		if err := h.linkCerts(ep); err != nil {
			problems = append(problems, fmt.Sprintf("%s: certificates of %s: %v", registry, ep.host, err))
		}
	}
	return b.String(), strings.Join(problems, "; ")
}

func (e endpoint) insecure() bool { return e.scheme == "http" || e.skipVerify }

// location is the endpoint as a registries.conf location: the host for the usual /v2
// root; for override_path under /v2 (the node-local mirror's "/v2/<source host>"), the
// host and the rest of the path, which containers/image puts after its /v2 as
// containerd does after override_path's root.
func (e endpoint) location() (string, bool) {
	switch {
	case e.path == "/v2" || e.path == "override:/v2":
		return e.host, true
	case strings.HasPrefix(e.path, "override:/v2/"):
		return e.host + "/" + strings.TrimPrefix(e.path, "override:/v2/"), true
	}
	return "", false
}

// readHostDir reads dir/hosts.toml as containerd does (hosts.go parseHostsFile): the
// [host."…"] tables in file order, then the top level's server.
func readHostDir(dir string) ([]endpoint, []string, error) {
	file := filepath.Join(dir, "hosts.toml")
	b, err := fsutil.ReadRegular(file, 1<<20)
	if os.IsNotExist(err) || (err == nil && len(b) == 0) {
		return certFiles(dir), nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var doc struct {
		hostFields
		Server string                `toml:"server"`
		Host   map[string]hostFields `toml:"host"`
	}
	md, err := toml.Decode(string(b), &doc)
	if err != nil {
		return nil, nil, err
	}
	var order []string
	seen := map[string]bool{}
	for _, k := range md.Keys() {
		if len(k) >= 2 && k[0] == "host" && !seen[k[1]] {
			seen[k[1]] = true
			order = append(order, k[1])
		}
	}
	var eps []endpoint
	var problems []string
	for _, name := range order {
		ep, err := parseEndpoint(name, dir, doc.Host[name])
		if err != nil {
			return nil, nil, err
		}
		problems = append(problems, unsupported(file, name, doc.Host[name])...)
		eps = append(eps, ep)
	}
	top, err := parseEndpoint(doc.Server, dir, doc.hostFields)
	if err != nil {
		return nil, nil, err
	}
	problems = append(problems, unsupported(file, "server", doc.hostFields)...)
	return append(eps, top), problems, nil
}

func unsupported(file, name string, f hostFields) []string {
	if f.Header != nil {
		return []string{fmt.Sprintf("%s: %s sets header, which the disk check does not send", file, name)}
	}
	return nil
}

func parseEndpoint(server, dir string, f hostFields) (endpoint, error) {
	var ep endpoint
	if server != "" {
		if !strings.HasPrefix(server, "http") {
			server = "https://" + server
		}
		u, err := url.Parse(server)
		if err != nil {
			return ep, fmt.Errorf("server %q: %w", server, err)
		}
		ep.scheme, ep.host = u.Scheme, u.Host
		switch {
		case u.Path != "":
			ep.path = path.Clean(u.Path)
			if !strings.HasSuffix(ep.path, "/v2") && !f.OverridePath {
				ep.path += "/v2"
			}
		case !f.OverridePath:
			ep.path = "/v2"
		}
		if f.OverridePath {
			ep.path = "override:" + ep.path
		}
	}
	if f.SkipVerify != nil {
		ep.skipVerify = *f.SkipVerify
	}
	if len(f.Capabilities) == 0 {
		ep.pull, ep.resolve = true, true
	}
	for _, c := range f.Capabilities {
		switch strings.ToLower(c) {
		case "pull":
			ep.pull = true
		case "resolve":
			ep.resolve = true
		case "push", "referrers":
		default:
			return ep, fmt.Errorf("unknown capability %v", c)
		}
	}
	abs := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	switch ca := f.CA.(type) {
	case nil:
	case string:
		ep.ca = []string{abs(ca)}
	case []any:
		for _, c := range ca {
			s, ok := c.(string)
			if !ok {
				return ep, fmt.Errorf("invalid ca %v", c)
			}
			ep.ca = append(ep.ca, abs(s))
		}
	default:
		return ep, fmt.Errorf("invalid type %T for ca", ca)
	}
	switch cl := f.Client.(type) {
	case nil:
	case string:
		ep.client = [][2]string{{abs(cl), ""}}
	case []any:
		for _, p := range cl {
			switch p := p.(type) {
			case string:
				ep.client = append(ep.client, [2]string{abs(p), ""})
			case []any:
				if len(p) != 2 {
					return ep, fmt.Errorf("invalid pair %v for client", p)
				}
				c, ok1 := p[0].(string)
				k, ok2 := p[1].(string)
				if !ok1 || !ok2 {
					return ep, fmt.Errorf("invalid pair %v for client", p)
				}
				ep.client = append(ep.client, [2]string{abs(c), abs(k)})
			default:
				return ep, fmt.Errorf("invalid type %T for client", p)
			}
		}
	default:
		return ep, fmt.Errorf("invalid type %T for client", cl)
	}
	return ep, nil
}

// certFiles is a hosts directory without hosts.toml: Docker's certs.d layout (*.crt CA
// files, *.cert with *.key client pairs) for the default host.
func certFiles(dir string) []endpoint {
	ep := endpoint{pull: true, resolve: true}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		name := filepath.Join(dir, e.Name())
		switch {
		case strings.HasSuffix(e.Name(), ".crt"):
			ep.ca = append(ep.ca, name)
		case strings.HasSuffix(e.Name(), ".cert"):
			key := strings.TrimSuffix(name, ".cert") + ".key"
			if _, err := os.Stat(key); err != nil {
				key = ""
			}
			ep.client = append(ep.client, [2]string{name, key})
		}
	}
	return []endpoint{ep}
}

// linkCerts makes certs.d/<host> hold the endpoint's CA and client files (symbolic
// links, so a rotated file is read afresh), as containers/image reads them.
func (h *Hosts) linkCerts(ep endpoint) error {
	if ep.host == "" || (len(ep.ca) == 0 && len(ep.client) == 0) {
		return nil
	}
	dir := filepath.Join(h.Dir, "certs.d", ep.host)
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for i, ca := range ep.ca {
		if err := os.Symlink(ca, filepath.Join(dir, fmt.Sprintf("ca-%d.crt", i))); err != nil {
			return err
		}
	}
	for i, pair := range ep.client {
		key := pair[1]
		if key == "" {
			key = pair[0] // one PEM file with the certificate and its key
		}
		if err := os.Symlink(pair[0], filepath.Join(dir, fmt.Sprintf("client-%d.cert", i))); err != nil {
			return err
		}
		if err := os.Symlink(key, filepath.Join(dir, fmt.Sprintf("client-%d.key", i))); err != nil {
			return err
		}
	}
	return nil
}

// write puts every entry in one registries.conf named by its content, so that
// containers/image, which caches a parsed registries.conf by its path, reads a new one.
func (h *Hosts) write() error {
	regs := make([]string, 0, len(h.entries))
	for r := range h.entries {
		regs = append(regs, r)
	}
	sort.Strings(regs)
	var b strings.Builder
	b.WriteString("# Written by imagepind from containerd's registry hosts (" + h.ConfigPath + ") for the disk check. Do not edit.\nunqualified-search-registries = []\n")
	for _, r := range regs {
		b.WriteString(h.entries[r].text)
	}
	sum := sha256.Sum256([]byte(b.String()))
	name := filepath.Join(h.Dir, "registries-"+hex.EncodeToString(sum[:6])+".conf")
	if name == h.conf {
		return nil
	}
	if err := os.MkdirAll(filepath.Join(h.Dir, "registries.conf.d"), 0o700); err != nil {
		return err
	}
	if err := fsutil.WriteAtomic(name, h.Dir, []byte(b.String()), 0o600); err != nil {
		return err
	}
	if h.prevConf != "" {
		os.Remove(h.prevConf)
	}
	h.prevConf, h.conf = h.conf, name
	return nil
}

func isLocalhost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
