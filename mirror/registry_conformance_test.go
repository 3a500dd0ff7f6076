package mirror_test

import (
	"testing"

	"github.com/imagepin/imagepin/mirror"
	"github.com/imagepin/imagepin/mirror/sourcetest"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/test/registrytest"
)

// The registry as a Source (mirror.FromRegistry) keeps the contract: through the
// node's own access (registry.Client, containers/image) to an in-process registry,
// trusted by certs.d, as the node reaches it.
func TestRegistrySourceConforms(t *testing.T) {
	sourcetest.Run(t, sourcetest.Subject{New: func(t *testing.T, o *sourcetest.Origin) mirror.Source {
		return fromOrigin(t, o)
	}})
}

// fromOrigin is the registry source reaching o's registry as a node would.
func fromOrigin(t *testing.T, o *sourcetest.Origin) mirror.Source {
	f := registrytest.NewFiles(t, "")
	return mirror.FromRegistry(registry.New(registry.Config{RegistriesConf: f.Conf, RegistriesConfDir: f.ConfDir, CertsDir: o.CertsDir(t)}, nil))
}
