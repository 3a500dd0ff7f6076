package wire

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"

	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/containerd"
	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/mirror"
	"github.com/imagepin/imagepin/peers"
	"github.com/imagepin/imagepin/pullcreds"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/tagcheck"
	"github.com/imagepin/imagepin/tagmirror"
	"github.com/imagepin/imagepin/tagpin"
)

// TagParts pre-load the tags the sets pin (package tagpin): the keeper, and on CRI-O
// with [peers] the node-local mirror's TLS endpoint for tags (package tagmirror).
type TagParts struct {
	Keeper  *tagpin.Keeper
	Server  *tagmirror.Server
	Checker *tagcheck.Checker
	// Poke, set by the caller before Agent, wakes the agent to publish a moved tag.
	Poke func()
	// fault says why the endpoint is not served.
	fault atomic.Value
}

// Status is the tags for the node's status (agent.Deps.TagStatus): how many the sets
// pin, how many the runtime holds, which moved in their registry; and the faults of the
// pre-load.
func (p *TagParts) Status() (*status.Tags, []string) {
	tags := p.Keeper.Tags()
	if len(tags) == 0 {
		return nil, nil
	}
	st := &status.Tags{Pinned: len(tags), Moved: p.Checker.Moved()}
	for _, t := range tags {
		if p.Keeper.Held(t.Name) {
			st.Held++
		}
	}
	faults := p.Keeper.Faults()
	if f, ok := p.fault.Load().(string); ok {
		faults = append(faults, f)
	}
	if !p.Keeper.Runs() {
		faults = append(faults, fmt.Sprintf("%d pinned tags are not pre-loaded: CRI-O learns a tag from the node-local mirror's tag endpoint, which needs [peers] enabled and tag_address (docs/tags.md); their digests are pinned", len(tags)))
	}
	return st, faults
}

// Run runs the keeper, the check and the endpoint until ctx ends. The endpoint listens
// before the keeper's first pull: a pull of a tag while it does not would go on to the
// registry.
func (p *TagParts) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return p.Checker.Run(ctx) })
	if p.Server != nil {
		l, err := p.Server.Listen()
		if err != nil {
			// Another process holds the address: nothing is pulled by tag (it would
			// not come from here); the rest of imagepind runs on.
			p.fault.Store(fmt.Sprintf("the node-local mirror's tag endpoint %s: %v: tags are not pre-loaded until imagepind restarts with the address free", p.Server.Address, err))
			p.Server.Log.WithError(err).Error("tag endpoint not served; tags are not pre-loaded")
			return g.Wait()
		}
		g.Go(func() error { return p.Server.ServeOn(ctx, l) })
	}
	g.Go(func() error { return p.Keeper.Run(ctx) })
	return g.Wait()
}

// Tags builds the tag parts for the runtime: containerd's tag records; on CRI-O, pulls
// of the tags through the mirror's TLS endpoint, whose CA (in stateDir) CRI-O is made
// to trust for [peers] tag_address in [disk] certs_dir. Without [peers] (or with
// tag_address "") CRI-O gets no tags (a fault while sets pin some). node is the bound
// mirror (BindPeers).
func Tags(cfg conf.Config, runtimeName, stateDir string, client *cri.Client, node *peers.Node, secret *pullcreds.SecretFile, log logrus.FieldLogger) (TagParts, error) {
	log = log.WithField("part", "tags")
	parts, err := tagParts(cfg, runtimeName, stateDir, client, node, log)
	if err != nil {
		return TagParts{}, err
	}
	// The registry as the runtime reaches it, but never through the node-local mirror's
	// drop-in (its tag endpoint answers the pinned digest): on CRI-O with [peers] the
	// administrator's registries files as BindPeers keeps them.
	rc, _ := RegistryAccess(cfg, runtimeName, stateDir)
	if runtimeName != conf.RuntimeContainerd && node != nil {
		rc.RegistriesConfDir = filepath.Join(stateDir, "registries-admin.d")
	}
	parts.Checker = tagcheck.New(tagcheck.Config{}, registry.New(rc, secret.Lookup), parts.Keeper.Tags, nil, log)
	return parts, nil
}

func tagParts(cfg conf.Config, runtimeName, stateDir string, client *cri.Client, node *peers.Node, log logrus.FieldLogger) (TagParts, error) {
	if runtimeName == conf.RuntimeContainerd {
		images, err := containerd.DialImages(cfg.ContainerdSocket(), cfg.Containerd.Namespace)
		if err != nil {
			return TagParts{}, err
		}
		// A record deleted behind imagepind's back comes back at its image event (and
		// within 20 s should events be missed: a record is two cheap reads a tag).
		return TagParts{Keeper: tagpin.New(tagpin.Config{Every: 20 * time.Second}, &containerd.TagRecords{Images: images, Events: images}, nil, log)}, nil
	}
	if node == nil || cfg.Peers.TagAddress == "" {
		return TagParts{Keeper: tagpin.New(tagpin.Config{}, nil, nil, log)}, nil
	}
	ca, err := tagmirror.LoadCA(stateDir)
	if err != nil {
		return TagParts{}, err
	}
	if changed, err := tagmirror.Trust(cfg.Disk.CertsDir, cfg.Peers.TagAddress, ca.PEM()); err != nil {
		return TagParts{}, err
	} else if changed {
		log.WithField("dir", cfg.Disk.CertsDir).WithField("address", cfg.Peers.TagAddress).Info("CRI-O trusts the node-local mirror's CA for tags at this address alone")
	}
	keeper := tagpin.New(tagpin.Config{}, &tagpin.Pulls{CRI: client}, nil, log)
	var h http.Handler = mirror.WithTags(node.Handler(), keeper.Lookup)
	return TagParts{Keeper: keeper, Server: &tagmirror.Server{Address: cfg.Peers.TagAddress, CA: ca, Handler: h, Log: log}}, nil
}
