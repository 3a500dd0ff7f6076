package wire

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/containerd"
	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/crio"
	"github.com/imagepin/imagepin/nodegiveback"
	"github.com/imagepin/imagepin/original"
	"github.com/imagepin/imagepin/tags/endpoint"
)

// GiveBack is `imagepind uninstall` for the node's runtime ([cri] runtime, else asked of
// it): containerd's labels released, CRI-O reloaded, the runtime files imagepind writes
// read and swept where the config puts them. close ends its connections.
func GiveBack(cfg conf.Config, lockFile string, log logrus.FieldLogger) (nodegiveback.Config, nodegiveback.Deps, func(), error) {
	gc := nodegiveback.Config{StateDir: cfg.StateDir, StoreDir: StoreDir(cfg, cfg.StateDir), Keep: []string{lockFile}}
	client, err := cri.Dial(cfg.CRI.Endpoint)
	if err != nil {
		return gc, nodegiveback.Deps{}, nil, err
	}
	runtimeName := DetectRuntime(cfg, client, 0, log)
	client.Close()
	d := nodegiveback.Deps{
		Originals: original.New(cfg.StateDir),
		Rest:      hostsRest(cfg.Containerd.ConfigPath),
		Sweep:     sweep(cfg),
		Log:       log,
	}
	closeAll := func() {}
	if runtimeName == conf.RuntimeContainerd {
		images, err := containerd.DialImages(cfg.ContainerdSocket(), cfg.Containerd.Namespace)
		if err != nil {
			return gc, d, nil, err
		}
		closeAll = func() { images.Close() }
		d.Unpin = func(ctx context.Context) ([]string, error) {
			p := &containerd.Pinner{Images: images, Namespace: cfg.Containerd.Namespace,
				Record: filepath.Join(cfg.StateDir, "containerd-labels.json"), Log: log}
			held := p.Held()
			if _, err := p.Write(ctx, nil, func(string) (bool, bool) { return false, false }); err != nil {
				return nil, err
			}
			tags, err := images.Labeled(ctx, containerd.TagLabel)
			if err != nil {
				return nil, fmt.Errorf("image records of pinned tags: %w", err)
			}
			for _, name := range tags {
				if err := images.SetPinned(ctx, name, false); err != nil {
					return nil, fmt.Errorf("release %s: %w", name, err)
				}
			}
			return append(held, tags...), nil
		}
	} else {
		reloader := Reloader(cfg, log)
		d.Reload = reloader.Reload
	}
	return gc, d, closeAll, nil
}

// hostsRest reads imagepind's part of a hosts.toml under containerd's config_path; every
// other file imagepind writes is its own altogether.
func hostsRest(configPath string) func(string, []byte) []byte {
	return func(path string, text []byte) []byte {
		if configPath == "" || filepath.Base(path) != "hosts.toml" {
			return nil
		}
		if rel, err := filepath.Rel(configPath, path); err != nil || strings.HasPrefix(rel, "..") {
			return nil
		}
		return containerd.WithoutMirror(text)
	}
}

// sweep takes imagepind's part out of the runtime's files by what each writer knows of
// its own (as with [peers] off, peersLeftovers, and the pin drop-in), for files an
// imagepind older than the original records wrote.
func sweep(cfg conf.Config) func() ([]string, error) {
	return func() ([]string, error) {
		var changed []string
		dropIn := crio.DropIn{MainConfig: cfg.CRIO.Config, ConfigDir: cfg.CRIO.ConfigDir}
		if c, err := dropIn.Apply(nil); err != nil {
			return nil, fmt.Errorf("CRI-O's pin drop-in: %w", err)
		} else if c {
			changed = append(changed, dropIn.Path())
		}
		mr := &crio.MirrorRegistries{Admin: &crio.AdminFiles{Dir: cfg.Disk.RegistriesConfDir}}
		if c, err := mr.Render(nil); err != nil {
			return nil, err
		} else if c {
			changed = append(changed, filepath.Join(cfg.Disk.RegistriesConfDir, crio.MirrorDropInName))
		}
		if cfg.Containerd.ConfigPath != "" {
			mh := &containerd.MirrorHosts{Record: hostsRecord(cfg.StateDir), ConfigPath: cfg.Containerd.ConfigPath}
			if err := mh.SyncHosts(nil); err != nil {
				return nil, fmt.Errorf("containerd's hosts.toml: %w", err)
			}
		}
		if addr := cfg.Peers.TagAddress; addr != "" {
			if err := endpoint.Forget(cfg.StateDir, cfg.Disk.CertsDir, addr); err != nil {
				return nil, fmt.Errorf("the tag endpoint's CA in certs.d: %w", err)
			}
		}
		return changed, nil
	}
}
