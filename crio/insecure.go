package crio

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// InsecureRegistries returns [crio.image] insecure_registries as CRI-O has it now.
func (l *LiveConfig) InsecureRegistries(ctx context.Context) ([]string, error) {
	body, err := l.config(ctx)
	if err != nil {
		return nil, err
	}
	var cfg struct {
		Crio struct {
			Image struct {
				InsecureRegistries []string `toml:"insecure_registries"`
			} `toml:"image"`
		} `toml:"crio"`
	}
	if _, err := toml.Decode(string(body), &cfg); err != nil {
		return nil, fmt.Errorf("parse CRI-O config: %w", err)
	}
	return cfg.Crio.Image.InsecureRegistries, nil
}

// VerifiesTLS says whether a CRI-O before 1.35 verifies TLS on every endpoint of a pull
// from registry (host[:port]), insecure being its insecure_registries. It skips
// verification on every endpoint of a pull, mirrors included, when the image's own
// registry is insecure to it (internal/storage: isSecureIndex, then
// DockerInsecureSkipTLSVerify): named in insecure_registries, or an address in one of
// its CIDRs or in 127.0.0.0/8, which CRI-O always adds. The tag endpoint is asked for
// no such registry: it would not be verified. From 1.35 CRI-O verifies each endpoint as
// registries.conf says of it (Support.TLSPerEndpoint), so this does not apply.
func VerifiesTLS(ctx context.Context, registry string, insecure []string) bool {
	cidrs := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	for _, r := range insecure {
		if p, err := netip.ParsePrefix(r); err == nil {
			cidrs = append(cidrs, p)
		} else if strings.EqualFold(r, registry) {
			return false
		}
	}
	host := registry
	if h, _, err := net.SplitHostPort(registry); err == nil {
		host = h
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		addrs = []netip.Addr{a}
	} else {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ips, err := net.DefaultResolver.LookupNetIP(lctx, "ip", host)
		cancel()
		if err == nil {
			addrs = ips
		}
	}
	for _, a := range addrs {
		for _, p := range cidrs {
			if p.Contains(a.Unmap()) {
				return false
			}
		}
	}
	return true
}
