package cri

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// listing is an image service that answers ListImages alone.
type listing struct {
	runtimeapi.ImageServiceClient
	images []*runtimeapi.Image
}

func (l listing) ListImages(context.Context, *runtimeapi.ListImagesRequest, ...grpc.CallOption) (*runtimeapi.ListImagesResponse, error) {
	return &runtimeapi.ListImagesResponse{Images: l.images}, nil
}

// The names are the runtime's, spelled as it lists them: a tag differing in case is
// another name (the runtime, and the kubelet asking it, find an image by its exact name).
func TestImageNamesKeepTheRuntimesSpelling(t *testing.T) {
	c := &Client{images: listing{images: []*runtimeapi.Image{{
		Id:          "id-v1",
		RepoTags:    []string{"quay.io/x/a:V1"},
		RepoDigests: []string{"quay.io/x/a@sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
	}}}}
	names, err := c.ImageNames(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if names["quay.io/x/a:V1"] != "id-v1" {
		t.Fatalf("quay.io/x/a:V1 not listed as the runtime spells it: %v", names)
	}
	if id, ok := names["quay.io/x/a:v1"]; ok {
		t.Fatalf("quay.io/x/a:v1 listed (as %s): the runtime holds only :V1", id)
	}
}
