package release

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/registry"
)

// Release is what a release image says, independent of any node.
type Release struct {
	Image   string `json:"image"`
	Version string `json:"version"`
	Multi   bool   `json:"multi"`
	// Components are the payload's images other than OS images: tag → image.
	Components map[string]string `json:"components"`
	// Streams are the OS image streams: name → tag → image.
	Streams map[string]map[string]string `json:"streams"`
	// DefaultStream is the stream of the rhel-coreos (OKD: stream-coreos) tag.
	DefaultStream string `json:"defaultStream"`
}

// OS image tags, by the stream they make up when unlabelled.
var osTags = map[string]string{
	"rhel-coreos":               "rhel-coreos",
	"rhel-coreos-extensions":    "rhel-coreos",
	"rhel-coreos-10":            "rhel-coreos-10",
	"rhel-coreos-10-extensions": "rhel-coreos-10",
	"stream-coreos":             "stream-coreos",
	"stream-coreos-extensions":  "stream-coreos",
}

// StreamLabel names an OS image's stream.
const StreamLabel = "io.openshift.os.streamclass"

// Images returns what a node (or pool) needs: every component, the OS images of the
// stream ("" = the default), and the release image itself on control-plane nodes;
// deduplicated and sorted.
func (r Release) Images(controlPlane bool, stream string) ([]string, error) {
	if stream == "" {
		stream = r.DefaultStream
	}
	osImages, ok := r.Streams[stream]
	if !ok && len(r.Streams) > 0 {
		return nil, fmt.Errorf("release %s has no OS image stream %q; it has %s", r.Version, stream, strings.Join(r.StreamNames(), ", "))
	}
	seen := map[string]bool{}
	var out []string
	add := func(img string) {
		if !seen[img] {
			seen[img] = true
			out = append(out, img)
		}
	}
	for _, img := range r.Components {
		add(img)
	}
	for _, img := range osImages {
		add(img)
	}
	if controlPlane {
		add(r.Image)
	}
	sort.Strings(out)
	return out, nil
}

// StreamNames lists the release's OS streams.
func (r Release) StreamNames() []string {
	var names []string
	for n := range r.Streams {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// IsControlPlane says whether node labels make a control-plane node.
func IsControlPlane(labels map[string]string) bool {
	_, master := labels["node-role.kubernetes.io/master"]
	_, cp := labels["node-role.kubernetes.io/control-plane"]
	return master || cp
}

// Source opens images at their registries: *registry.Client, the same access as the
// disk check's, with its timeouts, bounds and error classes.
type Source interface {
	OpenImage(ctx context.Context, image string) (*registry.ImageReader, error)
}

// ErrNotRelease means the image has no release manifests.
var ErrNotRelease = errors.New("not a release image")

// Expand reads a release image. pullSpec must be by digest.
func Expand(ctx context.Context, open Source, pullSpec string) (Release, error) {
	if err := pinset.ValidateImage(pullSpec); err != nil {
		return Release{}, fmt.Errorf("release pull spec: %w", err)
	}
	src, err := open.OpenImage(ctx, pullSpec)
	if err != nil {
		return Release{}, fmt.Errorf("release %s: %w", pullSpec, err)
	}
	defer src.Close()
	refs, meta, err := readManifests(ctx, src, pullSpec)
	if err != nil {
		return Release{}, err
	}
	r := Release{Image: pullSpec, Version: meta.Version, Components: map[string]string{}, Streams: map[string]map[string]string{}}
	r.Multi = meta.Metadata["release.openshift.io/architecture"] == "multi"
	labelled := map[string]string{} // OS tag → stream from labels
	for _, tag := range refs.Spec.Tags {
		from := tag.From.Name
		if tag.From.Kind != "DockerImage" || from == "" {
			continue
		}
		if err := pinset.ValidateImage(from); err != nil {
			return Release{}, fmt.Errorf("release %s: image-references tag %q: %w", pullSpec, tag.Name, err)
		}
		if _, os := osTags[tag.Name]; !os {
			r.Components[tag.Name] = from
			continue
		}
		stream, err := streamOf(ctx, open, from)
		if err != nil {
			return Release{}, fmt.Errorf("release %s: OS image %s (%s): %w", pullSpec, tag.Name, from, err)
		}
		if stream != "" {
			labelled[tag.Name] = stream
		}
	}
	for _, tag := range refs.Spec.Tags {
		pairStream, os := osTags[tag.Name]
		if !os || tag.From.Name == "" {
			continue
		}
		stream := labelled[tag.Name]
		if stream == "" {
			stream = pairStream
			if label := labelled[pairStream]; label != "" { // the extensions of a labelled base image
				stream = label
			}
		}
		if r.Streams[stream] == nil {
			r.Streams[stream] = map[string]string{}
		}
		r.Streams[stream][tag.Name] = tag.From.Name
		if tag.Name == "rhel-coreos" || (tag.Name == "stream-coreos" && r.DefaultStream == "") {
			r.DefaultStream = stream
		}
	}
	if r.DefaultStream == "" && len(r.Streams) == 1 {
		r.DefaultStream = r.StreamNames()[0]
	}
	return r, nil
}

type imageStream struct {
	Kind string `json:"kind"`
	Spec struct {
		Tags []struct {
			Name string `json:"name"`
			From struct {
				Kind string `json:"kind"`
				Name string `json:"name"`
			} `json:"from"`
		} `json:"tags"`
	} `json:"spec"`
}

type metadata struct {
	Kind     string            `json:"kind"`
	Version  string            `json:"version"`
	Metadata map[string]string `json:"metadata"`
}

// maxManifestFile bounds what we read of a release manifest.
const maxManifestFile = 16 << 20

// readManifests finds image-references and release-metadata: in the last layer, as oc
// release info reads them, else in any layer from the last to the first.
func readManifests(ctx context.Context, src *registry.ImageReader, pullSpec string) (imageStream, metadata, error) {
	m, err := src.Manifest(ctx)
	if err != nil {
		return imageStream{}, metadata{}, fmt.Errorf("release %s: %w", pullSpec, err)
	}
	layers := m.Layers
	var refsData, metaData []byte
	for i := len(layers) - 1; i >= 0 && (refsData == nil || metaData == nil); i-- {
		r, m2, err := scanLayer(ctx, src, layers[i])
		if err != nil {
			return imageStream{}, metadata{}, fmt.Errorf("release %s: layer %s: %w", pullSpec, layers[i].Digest, err)
		}
		if refsData == nil {
			refsData = r
		}
		if metaData == nil {
			metaData = m2
		}
	}
	if refsData == nil || metaData == nil {
		return imageStream{}, metadata{}, fmt.Errorf("%w: %s has no release-manifests/image-references and release-metadata in its layers", ErrNotRelease, pullSpec)
	}
	var refs imageStream
	if err := yaml.Unmarshal(refsData, &refs); err != nil || refs.Kind != "ImageStream" {
		return imageStream{}, metadata{}, fmt.Errorf("%w: %s: release-manifests/image-references is not an ImageStream (%v)", ErrNotRelease, pullSpec, err)
	}
	var meta metadata
	if err := json.Unmarshal(metaData, &meta); err != nil || meta.Kind != "cincinnati-metadata-v0" {
		return imageStream{}, metadata{}, fmt.Errorf("%w: %s: release-manifests/release-metadata is not cincinnati-metadata-v0 (%v)", ErrNotRelease, pullSpec, err)
	}
	return refs, meta, nil
}

func scanLayer(ctx context.Context, src *registry.ImageReader, layer registry.Descriptor) (refs, meta []byte, err error) {
	rc, err := src.Blob(ctx, layer)
	if err != nil {
		return nil, nil, err
	}
	defer rc.Close()
	gz, err := gzip.NewReader(rc)
	if err != nil {
		return nil, nil, err
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return refs, meta, nil
		}
		if err != nil {
			return nil, nil, err
		}
		name := strings.TrimPrefix(h.Name, "./")
		if name != "release-manifests/image-references" && name != "release-manifests/release-metadata" {
			continue
		}
		if h.Size > maxManifestFile {
			return nil, nil, fmt.Errorf("%s: %d bytes", name, h.Size)
		}
		data, err := io.ReadAll(io.LimitReader(tr, maxManifestFile))
		if err != nil {
			return nil, nil, err
		}
		if strings.HasSuffix(name, "image-references") {
			refs = data
		} else {
			meta = data
		}
	}
}

// streamOf reads an OS image's io.openshift.os.streamclass label ("" when absent).
func streamOf(ctx context.Context, open Source, image string) (string, error) {
	src, err := open.OpenImage(ctx, image)
	if err != nil {
		return "", err
	}
	defer src.Close()
	m, err := src.Manifest(ctx)
	if err != nil {
		return "", err
	}
	rc, err := src.Blob(ctx, m.Config)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	var cfg struct {
		Config struct {
			Labels map[string]string `json:"Labels"`
		} `json:"config"`
	}
	if err := json.NewDecoder(io.LimitReader(rc, 4<<20)).Decode(&cfg); err != nil {
		return "", fmt.Errorf("image config: %w", err)
	}
	return cfg.Config.Labels[StreamLabel], nil
}
