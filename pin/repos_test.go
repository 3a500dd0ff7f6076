package pin

import (
	"slices"
	"testing"
)

func TestRepositories(t *testing.T) {
	got := Repositories([]string{
		"quay.io/ocp/etcd@sha256:" + "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90",
		"quay.io/ocp/etcd@sha256:" + "0000000000000000000000000000000000000000000000000000000000000000",
		"busybox@sha256:" + "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90",
		"quay.io/ocp/*",
		"not a reference",
	})
	if want := []string{"docker.io/library/busybox", "quay.io/ocp/etcd"}; !slices.Equal(got, want) {
		t.Fatalf("%v, want %v", got, want)
	}
}
