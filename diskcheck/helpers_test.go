package diskcheck

import (
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/test/registrytest"
)

var (
	layer      = registrytest.RandomLayer
	image      = registrytest.Image
	layerBytes = registrytest.LayerBytes
	newFiles   = registrytest.NewFiles
)

func resolver(f registrytest.Files, p registry.Platform, creds registry.Credentials) *registry.Client {
	if p.OS == "" {
		p = registry.Platform{OS: "linux", Architecture: "amd64"}
	}
	return registry.New(registry.Config{RegistriesConf: f.Conf, RegistriesConfDir: f.ConfDir, CertsDir: f.Certs, Platform: p, Concurrency: 4}, creds)
}
