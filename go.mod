module github.com/imagepin/imagepin

go 1.26.8

require (
	github.com/BurntSushi/toml v1.6.0
	github.com/distribution/reference v0.6.0
	golang.org/x/sys v0.49.0
	k8s.io/apimachinery v0.34.1
	sigs.k8s.io/yaml v1.6.0
)

require (
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	k8s.io/klog/v2 v2.130.1 // indirect
	k8s.io/utils v0.0.0-20250604170112-4c0f3b243397 // indirect
	sigs.k8s.io/json v0.0.0-20241014173422-cfa47c3a1cc8 // indirect
)
