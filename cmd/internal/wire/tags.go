package wire

import (
	"net/http"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/containerd"
	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/mirror"
	"github.com/imagepin/imagepin/original"
	"github.com/imagepin/imagepin/peers"
	"github.com/imagepin/imagepin/pullcreds"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/tags"
	"github.com/imagepin/imagepin/tags/check"
	"github.com/imagepin/imagepin/tags/endpoint"
	"github.com/imagepin/imagepin/tags/keep"
)

// Tags builds the pre-load of the tags the sets pin for the runtime (package tags):
// containerd's tag records; on CRI-O, pulls of the tags through the node-local mirror's
// TLS endpoint, whose CA (in stateDir) CRI-O is made to trust for [peers] tag_address
// in [disk] certs_dir. Without [peers] (or with tag_address "") CRI-O gets no tags (a
// fault while sets pin some). node is the bound mirror (BindPeers); onChange is called
// when what the tags report changes.
func Tags(cfg conf.Config, runtimeName, stateDir string, client *cri.Client, node *peers.Node, secret *pullcreds.SecretFile, onChange func(), log logrus.FieldLogger) (*tags.Node, error) {
	log = log.WithField("part", "tags")
	parts, err := tagParts(cfg, runtimeName, stateDir, client, node, log)
	if err != nil {
		return nil, err
	}
	// The registry as the runtime reaches it, but never through the node-local mirror's
	// drop-in (its tag endpoint answers the pinned digest): on CRI-O with [peers] the
	// administrator's registries files as BindPeers keeps them.
	rc, _ := RegistryAccess(cfg, runtimeName, stateDir)
	if runtimeName != conf.RuntimeContainerd && node != nil {
		rc.RegistriesConfDir = adminRegistriesDir(stateDir)
	}
	parts.Checker = check.New(check.Config{}, registry.New(rc, secret.Lookup), parts.Keeper.Tags, nil, log)
	return tags.New(parts, onChange), nil
}

func tagParts(cfg conf.Config, runtimeName, stateDir string, client *cri.Client, node *peers.Node, log logrus.FieldLogger) (tags.Parts, error) {
	if runtimeName == conf.RuntimeContainerd {
		images, err := containerd.DialImages(cfg.ContainerdSocket(), cfg.Containerd.Namespace)
		if err != nil {
			return tags.Parts{}, err
		}
		// A record deleted behind imagepind's back comes back at its image event (and
		// within 20 s should events be missed: a record is two cheap reads a tag).
		return tags.Parts{Keeper: keep.New(keep.Config{Every: 20 * time.Second}, &containerd.TagRecords{Images: images, Events: images}, nil, log)}, nil
	}
	if node == nil || cfg.Peers.TagAddress == "" {
		return tags.Parts{Keeper: keep.New(keep.Config{}, nil, nil, log)}, nil
	}
	ca, err := endpoint.LoadCA(stateDir)
	if err != nil {
		return tags.Parts{}, err
	}
	if changed, err := endpoint.Trust(cfg.Disk.CertsDir, cfg.Peers.TagAddress, ca.PEM(), original.New(stateDir)); err != nil {
		return tags.Parts{}, err
	} else if changed {
		log.WithField("dir", cfg.Disk.CertsDir).WithField("address", cfg.Peers.TagAddress).Info("CRI-O trusts the node-local mirror's CA for tags at this address alone")
	}
	keeper := keep.New(keep.Config{}, &keep.Pulls{CRI: client}, nil, log)
	var h http.Handler = mirror.WithTags(node.Handler(), keeper.Lookup)
	return tags.Parts{Keeper: keeper, Endpoint: &endpoint.Server{Address: cfg.Peers.TagAddress, CA: ca, Handler: h, Log: log}}, nil
}
