package containerd

import (
	"context"
	"testing"

	typesapi "github.com/containerd/containerd/api/types"

	"github.com/imagepin/imagepin/pinset"
)

type fakeRecords map[string]Record

func (f fakeRecords) Get(_ context.Context, name string) (Record, error) {
	r, ok := f[name]
	if !ok {
		return Record{}, ErrNotFound
	}
	return r, nil
}
func (f fakeRecords) Put(_ context.Context, name string, r Record) error { f[name] = r; return nil }
func (f fakeRecords) Delete(_ context.Context, name string) error        { delete(f, name); return nil }
func (f fakeRecords) Labeled(_ context.Context, label string) ([]string, error) {
	var out []string
	for n, r := range f {
		if _, ok := r.Labels[label]; ok {
			out = append(out, n)
		}
	}
	return out, nil
}

// The tag's record takes the digest record's target and is pinned; a record of the tag
// pulled from a registry where it moved is made to match; the records made for tags no
// set pins go, an administrator's other records stay.
func TestTagRecordsFollowTheDigest(t *testing.T) {
	d := "sha256:" + "11111111111111111111111111111111111111111111111111111111111111aa"
	img := "quay.io/x/a@" + d
	tag := pinset.Tag{Name: "quay.io/x/a:v1", Image: img}
	f := fakeRecords{}
	r := &TagRecords{Images: f}
	ctx := context.Background()
	if held, err := r.Ensure(ctx, tag); held || err != nil {
		t.Fatalf("no digest record yet: %v %v", held, err)
	}
	target := &typesapi.Descriptor{MediaType: "application/vnd.oci.image.index.v1+json", Digest: d, Size: 500}
	f[img] = Record{Target: target, Labels: map[string]string{"io.cri-containerd.image": "managed"}}
	f[tag.Name] = Record{Target: &typesapi.Descriptor{MediaType: target.MediaType, Digest: "sha256:moved", Size: 10}}
	f["quay.io/x/a:admin"] = Record{Target: target, Labels: map[string]string{}}
	if held, err := r.Ensure(ctx, tag); !held || err != nil {
		t.Fatalf("%v %v", held, err)
	}
	got := f[tag.Name]
	if got.Target.Digest != d || got.Labels[PinnedLabel] != PinnedLabelValue || got.Labels[TagLabel] != img || got.Labels["io.cri-containerd.image"] != "managed" {
		t.Fatalf("record %+v", got)
	}
	if err := r.Forget(ctx, []pinset.Tag{tag}); err != nil || f[tag.Name].Target == nil {
		t.Fatalf("a wanted record forgotten: %v", err)
	}
	if err := r.Forget(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := f[tag.Name]; ok {
		t.Fatal("the record of a tag no set pins stays")
	}
	if _, ok := f["quay.io/x/a:admin"]; !ok {
		t.Fatal("an administrator's record was removed")
	}
}
