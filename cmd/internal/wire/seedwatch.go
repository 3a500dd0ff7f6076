package wire

import (
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/peers"
	"github.com/imagepin/imagepin/seed"
	seedwatch "github.com/imagepin/imagepin/seed/watch"
	"github.com/imagepin/imagepin/state"
)

// SeedWatch is the watcher of [seed] directory, seeding into the node's store; nil
// when none is set or [peers] is off (node nil).
func SeedWatch(cfg conf.Config, node *peers.Node, st *state.Store, log logrus.FieldLogger) *seedwatch.Watcher {
	if cfg.Seed.Directory == "" || node == nil {
		return nil
	}
	seeds := seed.Dir(st.Dir())
	seeder := seed.New(seed.Config{Dir: seeds, StoreDir: StoreDir(cfg, st.Dir())}, seed.Deps{Store: node.Store()})
	return seedwatch.New(seedwatch.Config{Dir: cfg.Seed.Directory, SeedsDir: seeds, Settle: cfg.Seed.Settle.D()},
		seedwatch.Deps{Seeder: seeder, Pinned: pinnedIn(st), Log: log.WithField("part", "seed-directory")})
}

// pinnedIn are the patterns imagepind keeps pinned, from its state.
func pinnedIn(st *state.Store) func() ([]string, error) {
	return func() ([]string, error) {
		d, err := st.Load()
		if err != nil {
			return nil, err
		}
		out := make([]string, 0, len(d.Pins))
		for p := range d.Pins {
			out = append(out, p)
		}
		return out, nil
	}
}
