package resolve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	yaml "go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/imagepin/imagepin/pinset"
)

// Ref is one image reference in a file: where it is and what it says.
type Ref struct {
	// Set is the set's metadata.name ("" in a list of images).
	Set string
	// Field is its path in the document: spec.pinnedImages[3].name, spec.releaseImage.
	Field string
	Image string
	node  *yaml.Node
}

// File is a set file (YAML or JSON; one or many documents; a List), or a plain list of
// image references (one per line, or a YAML sequence), with its image references.
type File struct {
	Name string
	// ImageList is true for a plain list of images rather than set documents.
	ImageList bool
	JSON      bool
	Refs      []Ref
	docs      []*yaml.Node
}

// Parse reads a file. name prefixes every error.
func Parse(name string, data []byte) (*File, error) {
	f := &File{Name: name, JSON: looksJSON(data)}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for i := 1; ; i++ {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		if len(doc.Content) == 0 {
			continue
		}
		f.docs = append(f.docs, &doc)
		if err := f.collect(doc.Content[0], fmt.Sprintf("document %d", i)); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	if len(f.docs) == 0 {
		return nil, fmt.Errorf("%s: no PinnedImageSet document and no image (the file is empty)", name)
	}
	if f.ImageList && len(f.docs) > 1 {
		return nil, fmt.Errorf("%s: a list of images must be a single document", name)
	}
	return f, nil
}

func looksJSON(data []byte) bool {
	t := bytes.TrimLeft(data, " \t\r\n")
	return len(t) > 0 && t[0] == '{'
}

// collect finds the references of one document (a set, a List of sets, or a list of images).
func (f *File) collect(root *yaml.Node, where string) error {
	switch root.Kind {
	case yaml.ScalarNode: // "a b c" or one per line: YAML folds the lines into one scalar
		f.ImageList = true
		for _, img := range strings.Fields(root.Value) {
			f.Refs = append(f.Refs, Ref{Field: "image list", Image: img})
		}
		return nil
	case yaml.SequenceNode:
		f.ImageList = true
		for i, n := range root.Content {
			if n.Kind != yaml.ScalarNode {
				return fmt.Errorf("%s: item %d of the image list: want an image reference, got a %s", where, i+1, kindName(n))
			}
			f.Refs = append(f.Refs, Ref{Field: fmt.Sprintf("image list[%d]", i), Image: n.Value})
		}
		return nil
	case yaml.MappingNode:
	default:
		return fmt.Errorf("%s: want a PinnedImageSet, a List of them or a list of images, got a %s", where, kindName(root))
	}
	kind := value(root, "kind")
	if kind == "List" {
		items := child(root, "items")
		if items == nil || items.Kind != yaml.SequenceNode {
			return fmt.Errorf("%s: items: a List needs a sequence of items", where)
		}
		for i, it := range items.Content {
			if err := f.collectSet(it, fmt.Sprintf("%s: items[%d]", where, i)); err != nil {
				return err
			}
		}
		return nil
	}
	return f.collectSet(root, where)
}

func (f *File) collectSet(n *yaml.Node, where string) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("%s: want a PinnedImageSet mapping, got a %s", where, kindName(n))
	}
	if k := value(n, "kind"); k != pinset.KindPinnedImageSet {
		return fmt.Errorf("%s: kind: %q, want %s (or List)", where, k, pinset.KindPinnedImageSet)
	}
	set := value(child(n, "metadata"), "name")
	spec := child(n, "spec")
	if spec == nil || spec.Kind != yaml.MappingNode {
		return fmt.Errorf("%s: set %q: spec: missing", where, set)
	}
	if pinned := child(spec, "pinnedImages"); pinned != nil {
		if pinned.Kind != yaml.SequenceNode {
			return fmt.Errorf("%s: set %q: spec.pinnedImages: want a sequence, got a %s", where, set, kindName(pinned))
		}
		for i, it := range pinned.Content {
			field := fmt.Sprintf("spec.pinnedImages[%d]", i)
			if it.Kind == yaml.MappingNode {
				it, field = child(it, "name"), field+".name"
			}
			if it == nil || it.Kind != yaml.ScalarNode {
				return fmt.Errorf("%s: set %q: %s: want an image reference", where, set, field)
			}
			f.Refs = append(f.Refs, Ref{Set: set, Field: field, Image: it.Value, node: it})
		}
	}
	if rel := child(spec, "releaseImage"); rel != nil && rel.Kind == yaml.ScalarNode && rel.Value != "" {
		f.Refs = append(f.Refs, Ref{Set: set, Field: "spec.releaseImage", Image: rel.Value, node: rel})
	}
	return nil
}

// Rewrite replaces each reference that to maps to something else, keeping the rest of
// the documents (comments and order in YAML) as they were.
func (f *File) Rewrite(to func(image string) string) {
	f.RewriteEach(func(r Ref) string { return to(r.Image) })
}

// RewriteEach is Rewrite deciding by the whole reference (its field, say).
func (f *File) RewriteEach(to func(r Ref) string) {
	for i := range f.Refs {
		r := &f.Refs[i]
		n := to(*r)
		if n == r.Image {
			continue
		}
		if r.node != nil {
			r.node.Value, r.node.Tag = n, "!!str"
		}
		r.Image = n
	}
}

// Bytes is the file again: YAML documents, or indented JSON when it was JSON.
func (f *File) Bytes() ([]byte, error) {
	if f.ImageList {
		return nil, errors.New("a list of images has no set document: use ListDocument")
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	for _, d := range f.docs {
		if err := enc.Encode(d); err != nil {
			return nil, err
		}
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	if !f.JSON {
		return buf.Bytes(), nil
	}
	j, err := sigsyaml.YAMLToJSON(buf.Bytes())
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, j, "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// ListDocument is a PinnedImageSet (imagepin.io/v1alpha1) named name, for the nodes
// selector selects, holding images.
func ListDocument(name string, selector *metav1.LabelSelector, images []string) ([]byte, error) {
	var pinned []map[string]string
	for _, img := range images {
		pinned = append(pinned, map[string]string{"name": img})
	}
	return sigsyaml.Marshal(map[string]any{
		"apiVersion": pinset.APIVersionImagepin,
		"kind":       pinset.KindPinnedImageSet,
		"metadata":   map[string]any{"name": name},
		"spec":       map[string]any{"nodeSelector": selector, "pinnedImages": pinned},
	})
}

func child(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func value(m *yaml.Node, key string) string {
	if n := child(m, key); n != nil && n.Kind == yaml.ScalarNode {
		return n.Value
	}
	return ""
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "sequence"
	case yaml.ScalarNode:
		return "scalar"
	case yaml.AliasNode:
		return "alias"
	}
	return "document"
}
