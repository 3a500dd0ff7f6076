package setgen

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	yaml "go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/imagepin/imagepin/pinset"
)

// Document is the PinnedImageSet (imagepin.io/v1alpha1) named name for the nodes
// nodeSelector selects, holding r's images by digest. Each image whose workloads name
// it by tag carries the tags in a comment on its line ("# tag: repo:v2"): the set
// format pins by digest alone. header lines become a comment above the document (where
// the images came from). The document is validated as imagepind reads it.
func Document(name string, nodeSelector *metav1.LabelSelector, r Result, header []string) ([]byte, error) {
	if len(r.Images) == 0 {
		return nil, errors.New("no image to pin: nothing selected runs an image with a registry digest")
	}
	if len(r.Images) > pinset.MaxImagesPerSet {
		return nil, fmt.Errorf("%d images: a set holds at most %d; narrow the selection (--selector, --namespace) and make several sets",
			len(r.Images), pinset.MaxImagesPerSet)
	}
	sel, err := selectorNode(nodeSelector)
	if err != nil {
		return nil, err
	}
	images := &yaml.Node{Kind: yaml.SequenceNode}
	for _, img := range r.Images {
		item := mapping("name", str(img.Ref))
		if len(img.Tags) > 0 {
			item.Content[1].LineComment = "tag: " + strings.Join(img.Tags, ", ")
		}
		images.Content = append(images.Content, item)
	}
	doc := mapping(
		"apiVersion", str(pinset.APIVersionImagepin),
		"kind", str(pinset.KindPinnedImageSet),
		"metadata", mapping("name", str(name)),
		"spec", mapping("nodeSelector", sel, "pinnedImages", images),
	)
	if len(header) > 0 {
		doc.HeadComment = strings.Join(header, "\n")
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{doc}}); err != nil {
		return nil, fmt.Errorf("set %q: %w", name, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("set %q: %w", name, err)
	}
	out := buf.Bytes()
	if _, err := pinset.ParseSetFile("set "+name, out); err != nil {
		return nil, fmt.Errorf("the set is not valid: %w", err)
	}
	return out, nil
}

// selectorNode is a label selector as a YAML mapping ({} selects every node).
func selectorNode(sel *metav1.LabelSelector) (*yaml.Node, error) {
	if sel == nil {
		sel = &metav1.LabelSelector{}
	}
	b, err := sigsyaml.Marshal(sel)
	if err != nil {
		return nil, fmt.Errorf("nodeSelector: %w", err)
	}
	var n yaml.Node
	if err := yaml.Unmarshal(b, &n); err != nil {
		return nil, fmt.Errorf("nodeSelector: %w", err)
	}
	m := n.Content[0]
	if m.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("nodeSelector: not a mapping")
	}
	if len(m.Content) == 0 {
		m.Style = yaml.FlowStyle
	}
	return m, nil
}

func str(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
}

func mapping(kv ...any) *yaml.Node {
	m := &yaml.Node{Kind: yaml.MappingNode}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Content = append(m.Content, str(kv[i].(string)), kv[i+1].(*yaml.Node))
	}
	return m
}
