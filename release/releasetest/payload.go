// Package releasetest builds OpenShift-like release payloads in a registry, for tests
// and benchmarks: components, OS images of two streams, and a release image whose last
// layer holds release-manifests/image-references and release-metadata; single-arch or
// multi (every image a manifest list). It is test code, never imported by a binary.
package releasetest

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Options describe a payload.
type Options struct {
	// PushHost is the registry pushed to; RefHost the host the payload names (a source
	// that may exist only behind a mirror); "" = PushHost.
	PushHost, RefHost string
	// Repo holds everything ("ocp/release"), components by digest as in real payloads.
	Repo       string
	Version    string
	Components int
	Multi      bool
	// Unlabelled OS images (no io.openshift.os.streamclass).
	Unlabelled bool
	// OKD: one stream-coreos stream instead of rhel-coreos + rhel-coreos-10.
	OKD       bool
	Transport http.RoundTripper
}

// Payload is what was pushed, as the payload names it.
type Payload struct {
	Release    string
	Version    string
	Components map[string]string // tag → ref
	OS         map[string]string // tag → ref
	// Streams maps an OS tag to the stream its label says ("" unlabelled).
	Streams map[string]string
}

// Push builds and pushes a payload.
func Push(ctx context.Context, o Options) (Payload, error) {
	if o.RefHost == "" {
		o.RefHost = o.PushHost
	}
	if o.Transport == nil {
		o.Transport = http.DefaultTransport
	}
	p := Payload{Version: o.Version, Components: map[string]string{}, OS: map[string]string{}, Streams: map[string]string{}}
	push := func(labels map[string]string) (string, error) {
		d, err := o.pushImage(ctx, labels, nil)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s/%s@%s", o.RefHost, o.Repo, d), nil
	}
	for i := 0; i < o.Components; i++ {
		ref, err := push(map[string]string{"io.openshift.build.name": fmt.Sprintf("component-%d", i)})
		if err != nil {
			return p, err
		}
		p.Components[fmt.Sprintf("component-%03d", i)] = ref
	}
	streams := map[string]string{"rhel-coreos": "rhel-9", "rhel-coreos-extensions": "rhel-9", "rhel-coreos-10": "rhel-10", "rhel-coreos-10-extensions": "rhel-10"}
	if o.OKD {
		streams = map[string]string{"stream-coreos": "centos-10", "stream-coreos-extensions": "centos-10"}
	}
	for tag, stream := range streams {
		labels := map[string]string{"containers.bootc": "1", "io.openshift.os.streamclass": stream}
		if tag == "rhel-coreos-extensions" || tag == "rhel-coreos-10-extensions" || tag == "stream-coreos-extensions" {
			labels["io.openshift.os.extensions"] = "true"
		}
		if o.Unlabelled {
			labels, stream = map[string]string{"os": tag}, ""
		}
		ref, err := push(labels)
		if err != nil {
			return p, err
		}
		p.OS[tag], p.Streams[tag] = ref, stream
	}
	// The release image: the manifests in its last layer.
	type tagRef struct {
		Name string `json:"name"`
		From struct {
			Kind string `json:"kind"`
			Name string `json:"name"`
		} `json:"from"`
	}
	var tags []tagRef
	for _, m := range []map[string]string{p.Components, p.OS} {
		for tag, ref := range m {
			t := tagRef{Name: tag}
			t.From.Kind, t.From.Name = "DockerImage", ref
			tags = append(tags, t)
		}
	}
	refs, _ := json.Marshal(map[string]any{"kind": "ImageStream", "apiVersion": "image.openshift.io/v1", "metadata": map[string]string{"name": o.Version}, "spec": map[string]any{"tags": tags}})
	meta := map[string]any{"kind": "cincinnati-metadata-v0", "version": o.Version}
	if o.Multi {
		meta["metadata"] = map[string]string{"release.openshift.io/architecture": "multi"}
	}
	metaJSON, _ := json.Marshal(meta)
	manifests, err := tarLayer(map[string][]byte{"release-manifests/image-references": refs, "release-manifests/release-metadata": metaJSON})
	if err != nil {
		return p, err
	}
	d, err := o.pushImage(ctx, map[string]string{"io.openshift.release": o.Version}, manifests)
	if err != nil {
		return p, err
	}
	p.Release = fmt.Sprintf("%s/%s@%s", o.RefHost, o.Repo, d)
	return p, nil
}

// pushImage pushes one image (a manifest list of amd64 and arm64 when Multi) with the
// given config labels and, optionally, a last layer; it returns the digest.
func (o Options) pushImage(ctx context.Context, labels map[string]string, last v1.Layer) (string, error) {
	build := func(arch string) (v1.Image, error) {
		l, err := random.Layer(512, types.DockerLayer)
		if err != nil {
			return nil, err
		}
		img, err := mutate.AppendLayers(empty.Image, l)
		if err != nil {
			return nil, err
		}
		if last != nil {
			if img, err = mutate.AppendLayers(img, last); err != nil {
				return nil, err
			}
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = "linux", arch
		cf.Config.Labels = labels
		return mutate.ConfigFile(img, cf)
	}
	repo, err := name.NewRepository(o.PushHost+"/"+o.Repo, name.Insecure)
	if err != nil {
		return "", err
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithTransport(o.Transport)}
	if !o.Multi {
		img, err := build("amd64")
		if err != nil {
			return "", err
		}
		d, _ := img.Digest()
		return d.String(), remote.Write(repo.Digest(d.String()), img, opts...)
	}
	idx := v1.ImageIndex(empty.Index)
	idx = mutate.IndexMediaType(idx, types.DockerManifestList)
	for _, arch := range []string{"amd64", "arm64"} {
		img, err := build(arch)
		if err != nil {
			return "", err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	d, _ := idx.Digest()
	return d.String(), remote.WriteIndex(repo.Digest(d.String()), idx, opts...)
}

func tarLayer(files map[string][]byte) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, data := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data))}); err != nil {
			return nil, err
		}
		tw.Write(data)
	}
	tw.Close()
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
}
