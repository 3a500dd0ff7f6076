package pullcreds

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/distribution/reference"
)

// Keyring holds the credentials of a kubelet-style pull secret (config.json with
// "auths"). It never prints a secret.
type Keyring struct {
	entries []keyEntry
}

type keyEntry struct {
	host string // may hold "*" labels
	path string // repository path prefix, without slashes around
	auth Auth
}

// ParseKeyring parses config.json content. Errors never quote the file's content.
func ParseKeyring(data []byte) (*Keyring, error) {
	var cfg struct {
		Auths map[string]struct {
			Auth     string `json:"auth"`
			Username string `json:"username"`
			Password string `json:"password"`
		} `json:"auths"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		// json errors may quote the offending bytes: do not pass them on.
		return nil, errors.New("not a JSON object with \"auths\"")
	}
	k := &Keyring{}
	for key, a := range cfg.Auths {
		auth := Auth{Username: a.Username, Password: a.Password}
		if a.Auth != "" {
			dec, err := base64.StdEncoding.DecodeString(a.Auth)
			if err != nil {
				return nil, fmt.Errorf("auths[%q].auth: not base64", key)
			}
			user, pass, ok := strings.Cut(string(dec), ":")
			if !ok {
				return nil, fmt.Errorf("auths[%q].auth: not user:password", key)
			}
			auth = Auth{Username: user, Password: pass}
		}
		host, p := splitKey(key)
		if host == "" {
			continue
		}
		k.entries = append(k.entries, keyEntry{host: host, path: p, auth: auth})
	}
	return k, nil
}

// splitKey turns "https://registry.example:5000/ns/repo/" into host and path, as the
// kubelet's credential provider does; "index.docker.io/v1/" keys stand for docker.io.
func splitKey(key string) (string, string) {
	key = strings.TrimPrefix(strings.TrimPrefix(key, "https://"), "http://")
	host, p, _ := strings.Cut(key, "/")
	p = strings.Trim(p, "/")
	host = strings.ToLower(host)
	if host == "index.docker.io" || host == "registry-1.docker.io" {
		host = "docker.io"
		if p == "v1" || p == "v2" {
			p = ""
		}
	}
	return host, p
}

// Lookup returns the credentials for an image: the entry whose host matches (with "*"
// globs per DNS label) and whose path is the longest prefix of the image's repository
// path; nil when none.
func (k *Keyring) Lookup(image string) *Auth {
	if k == nil || len(k.entries) == 0 {
		return nil
	}
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return nil
	}
	host := strings.ToLower(reference.Domain(named))
	repo := reference.Path(named)
	var best *keyEntry
	bestLen := -1
	for i := range k.entries {
		e := &k.entries[i]
		if !hostMatches(e.host, host) {
			continue
		}
		if e.path != "" && repo != e.path && !strings.HasPrefix(repo, e.path+"/") {
			continue
		}
		score := len(e.host) + len(e.path)
		if !strings.Contains(e.host, "*") {
			score += 1000 // an exact host beats a glob
		}
		if score > bestLen {
			best, bestLen = e, score
		}
	}
	if best == nil {
		return nil
	}
	a := best.auth
	return &a
}

func hostMatches(pattern, host string) bool {
	if pattern == host {
		return true
	}
	if !strings.Contains(pattern, "*") {
		return false
	}
	pp := strings.Split(pattern, ".")
	hp := strings.Split(host, ".")
	if len(pp) != len(hp) {
		return false
	}
	for i := range pp {
		if ok, _ := path.Match(pp[i], hp[i]); !ok {
			return false
		}
	}
	return true
}

// Len is how many entries the keyring holds (for logs: never the entries).
func (k *Keyring) Len() int {
	if k == nil {
		return 0
	}
	return len(k.entries)
}
