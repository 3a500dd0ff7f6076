package pinset

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/imagepin/imagepin/api/v1alpha1"

	"github.com/distribution/reference"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Limits on set documents.
const (
	// MaxSetFileSize bounds one file in the sets directory.
	MaxSetFileSize = 4 << 20
	// MaxImagesPerSet is the enhancement's limit.
	MaxImagesPerSet = 2000
	// MaxDocumentsPerFile bounds the documents (or List items) of one file.
	MaxDocumentsPerFile = 1000
)

// API groups and versions of the two document shapes.
const (
	APIVersionV1Alpha1 = "machineconfiguration.openshift.io/v1alpha1"
	APIVersionV1       = "machineconfiguration.openshift.io/v1"
	// APIVersionImagepin is imagepin's own API (api/v1alpha1): the CRD's objects, as
	// imagepind writes them into the sets directory, and as files alike.
	APIVersionImagepin = v1alpha1.APIVersion
	KindPinnedImageSet = "PinnedImageSet"
	// RoleLabel names the pool of a v1 set.
	RoleLabel = v1alpha1.RoleLabel
)

// Set is one validated PinnedImageSet.
type Set struct {
	Name     string
	UID      string
	File     string // relative to the sets directory
	Selector Selector
	// Images are digest references, in the document's order, without duplicates. An
	// image written repo:tag@sha256:… is here as repo@sha256:…: the digest is what is
	// pinned, pulled and served; its tag is in Tags.
	Images []string
	// Tags are the tags the set names with their pinned digests (repo:tag@sha256:…),
	// in the document's order: the runtime is made to know each tag as that digest.
	Tags     []Tag
	SpecHash string
	// ReleaseImage is spec.releaseImage: an OpenShift release to expand on the node;
	// OSImageStream picks its OS image stream ("" = the release's default).
	ReleaseImage  string
	OSImageStream string
}

// ParseResult is what one file holds.
type ParseResult struct {
	Sets []Set
	// Warnings are valid but surprising things (a v1 set without a role label).
	Warnings []string
}

// document is the union of both shapes; fields not listed are ignored outside spec.
type document struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metadata          `json:"metadata"`
	Spec       json.RawMessage   `json:"spec"`
	Items      []json.RawMessage `json:"items"`
}

type metadata struct {
	Name   string            `json:"name"`
	UID    string            `json:"uid"`
	Labels map[string]string `json:"labels"`
}

type spec struct {
	NodeSelector  *LabelSelector    `json:"nodeSelector"`
	PinnedImages  []json.RawMessage `json:"pinnedImages"`
	ReleaseImage  string            `json:"releaseImage"`
	OSImageStream string            `json:"osImageStream"`
}

// ParseSetFile parses and validates one file of the sets directory. name is the file's
// path relative to the sets directory and prefixes every error.
func ParseSetFile(name string, data []byte) (ParseResult, error) {
	res, err := parseSetFile(name, data)
	if err != nil {
		return ParseResult{}, fmt.Errorf("%s: %w", name, err)
	}
	return res, nil
}

func parseSetFile(name string, data []byte) (ParseResult, error) {
	var res ParseResult
	if len(data) > MaxSetFileSize {
		return res, fmt.Errorf("file too large: %d bytes, at most %d", len(data), MaxSetFileSize)
	}
	if !utf8.Valid(data) {
		return res, errors.New("not valid UTF-8")
	}
	docs, err := splitDocuments(data)
	if err != nil {
		return res, err
	}
	if len(docs) == 0 {
		return res, errors.New("no PinnedImageSet document (the file is empty)")
	}
	seen := map[string]int{}
	var errs []error
	for i, raw := range docs {
		where := fmt.Sprintf("document %d", i+1)
		var d document
		if err := json.Unmarshal(raw, &d); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, yamlTypeError(err, "")))
			continue
		}
		items := []json.RawMessage{raw}
		if d.Kind == "List" {
			items = d.Items
			if len(items) == 0 {
				errs = append(errs, fmt.Errorf("%s: List has no items", where))
			}
		}
		for j, item := range items {
			w := where
			if d.Kind == "List" {
				w = fmt.Sprintf("%s: items[%d]", where, j)
			}
			if len(res.Sets)+1 > MaxDocumentsPerFile {
				return res, fmt.Errorf("more than %d sets in one file", MaxDocumentsPerFile)
			}
			s, warning, err := parseDocument(item)
			if s.Name != "" {
				w = fmt.Sprintf("%s (set %q)", w, s.Name)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", w, err))
				continue
			}
			if prev, dup := seen[s.Name]; dup {
				errs = append(errs, fmt.Errorf("%s: metadata.name: set %q is also defined by document %d", w, s.Name, prev))
				continue
			}
			seen[s.Name] = i + 1
			s.File = name
			res.Sets = append(res.Sets, s)
			if warning != "" {
				res.Warnings = append(res.Warnings, fmt.Sprintf("%s: %s: %s", name, w, warning))
			}
		}
	}
	if len(errs) > 0 {
		return ParseResult{}, errors.Join(errs...)
	}
	return res, nil
}

// splitDocuments splits YAML on "---" lines (as kubectl does) and converts each
// non-empty document to JSON. JSON files are YAML too.
// Documents are a file's documents as JSON, each List replaced by its items: what
// imagepinctl merges into one List.
func Documents(data []byte) ([]json.RawMessage, error) {
	docs, err := splitDocuments(data)
	if err != nil {
		return nil, err
	}
	var out []json.RawMessage
	for i, raw := range docs {
		var d document
		if err := json.Unmarshal(raw, &d); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, yamlTypeError(err, ""))
		}
		if d.Kind == "List" {
			out = append(out, d.Items...)
			continue
		}
		out = append(out, raw)
	}
	return out, nil
}

func splitDocuments(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReaderSize(bytes.NewReader(data), 64*1024))
	var out [][]byte
	for n := 1; ; n++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			n--
			continue
		}
		if len(out) >= MaxDocumentsPerFile {
			return nil, fmt.Errorf("more than %d documents", MaxDocumentsPerFile)
		}
		j, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		if bytes.Equal(bytes.TrimSpace(j), []byte("null")) {
			n--
			continue
		}
		out = append(out, j)
	}
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			b.Write(line)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

func parseDocument(raw []byte) (Set, string, error) {
	var d document
	if err := json.Unmarshal(raw, &d); err != nil {
		return Set{}, "", yamlTypeError(err, "")
	}
	s := Set{Name: d.Metadata.Name}
	switch d.APIVersion {
	case APIVersionV1Alpha1, APIVersionV1, APIVersionImagepin:
	case "":
		return s, "", errors.New("apiVersion: missing")
	default:
		return s, "", fmt.Errorf("apiVersion: %q is not %s, %s or %s", d.APIVersion, APIVersionImagepin, APIVersionV1, APIVersionV1Alpha1)
	}
	if d.Kind != KindPinnedImageSet {
		return s, "", fmt.Errorf("kind: %q is not %s", d.Kind, KindPinnedImageSet)
	}
	if d.Metadata.Name == "" {
		return s, "", errors.New("metadata.name: missing")
	}
	if msgs := validation.IsDNS1123Subdomain(d.Metadata.Name); len(msgs) > 0 {
		return s, "", fmt.Errorf("metadata.name: %q is not a DNS-1123 subdomain: %s", d.Metadata.Name, strings.Join(msgs, "; "))
	}
	s.UID = d.Metadata.UID
	if s.UID == "" {
		s.UID = DerivedUID(s.Name)
	} else if len(s.UID) > 128 || strings.ContainsFunc(s.UID, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
		return s, "", errors.New("metadata.uid: must be at most 128 printable ASCII characters")
	}
	if len(d.Spec) == 0 || string(d.Spec) == "null" {
		return s, "", errors.New("spec: missing")
	}
	var sp spec
	dec := json.NewDecoder(bytes.NewReader(d.Spec))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sp); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return s, "", yamlTypeError(err, "spec.")
		}
		return s, "", fmt.Errorf("spec: %w", err)
	}

	var warning string
	var err error
	switch d.APIVersion {
	case APIVersionImagepin:
		if s.Selector, warning, err = imagepinSelector(sp.NodeSelector, d.Metadata.Labels); err != nil {
			return s, "", err
		}
	case APIVersionV1:
		if sp.NodeSelector != nil {
			return s, "", fmt.Errorf("spec.nodeSelector: not part of %s; the %s label selects the pool", APIVersionV1, RoleLabel)
		}
		pool, ok := d.Metadata.Labels[RoleLabel]
		if !ok || pool == "" {
			s.Selector = Nothing("no " + RoleLabel + " label")
			warning = "metadata.labels: no " + RoleLabel + " label, so the set applies to no node (as in OpenShift)"
		} else if s.Selector, err = RoleSelector(pool); err != nil {
			return s, "", fmt.Errorf("metadata.labels[%s]: %w", RoleLabel, err)
		}
	default:
		if s.Selector, err = NewSelector(sp.NodeSelector); err != nil {
			return s, "", fmt.Errorf("spec.nodeSelector: %w", err)
		}
	}

	if sp.ReleaseImage != "" {
		if err := ValidateImage(sp.ReleaseImage); err != nil {
			return s, "", fmt.Errorf("spec.releaseImage: %w", err)
		}
		s.ReleaseImage = sp.ReleaseImage
	}
	if sp.OSImageStream != "" {
		if sp.ReleaseImage == "" {
			return s, "", errors.New("spec.osImageStream: only with spec.releaseImage")
		}
		if msgs := validation.IsDNS1123Label(sp.OSImageStream); len(msgs) > 0 {
			return s, "", fmt.Errorf("spec.osImageStream: %q: %s", sp.OSImageStream, strings.Join(msgs, "; "))
		}
		s.OSImageStream = sp.OSImageStream
	}
	if len(sp.PinnedImages) == 0 && s.ReleaseImage == "" {
		return s, "", errors.New("spec.pinnedImages: no images (and no spec.releaseImage)")
	}
	if len(sp.PinnedImages) > MaxImagesPerSet {
		return s, "", fmt.Errorf("spec.pinnedImages: %d images, at most %d", len(sp.PinnedImages), MaxImagesPerSet)
	}
	index := make(map[string]int, len(sp.PinnedImages))
	digests := make(map[string]bool, len(sp.PinnedImages))
	type taggedAt struct {
		tag Tag
		at  int
	}
	tags := map[string]taggedAt{}
	var errs []error
	for i, rawImage := range sp.PinnedImages {
		field := fmt.Sprintf("spec.pinnedImages[%d]", i)
		name, err := imageName(rawImage)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field, err))
			continue
		}
		img, tag, err := ParsePinned(name)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field, err))
			continue
		}
		if prev, dup := index[hostFolded(name)]; dup {
			errs = append(errs, fmt.Errorf("%s: %q duplicates spec.pinnedImages[%d]", field, name, prev))
			continue
		}
		index[hostFolded(name)] = i
		if tag.Name != "" {
			if prev, dup := tags[tag.Name]; dup && prev.tag.Image != tag.Image {
				errs = append(errs, fmt.Errorf("%s: tag %s is also spec.pinnedImages[%d] with another digest (%s): a tag names one image", field, tag.Name, prev.at, prev.tag.Image))
				continue
			} else if !dup {
				tags[tag.Name] = taggedAt{tag, i}
				s.Tags = append(s.Tags, tag)
			}
		}
		if _, dup := digests[hostFolded(img)]; dup {
			continue // the same digest with another tag (or none): pinned once
		}
		digests[hostFolded(img)] = true
		s.Images = append(s.Images, img)
	}
	if len(errs) > 0 {
		// Enough to fix a file without drowning the status in a 2000-line error.
		if len(errs) > 10 {
			errs = append(errs[:10], fmt.Errorf("... and %d more image errors", len(errs)-10))
		}
		return s, "", errors.Join(errs...)
	}
	s.SpecHash = specHash(s.Selector.String(), s.Images, s.Tags, s.ReleaseImage, s.OSImageStream)
	return s, warning, nil
}

// hostFolded is a fully qualified reference with its registry host lower-cased, for
// telling duplicates: the host is case-insensitive, the repository path is lower case
// already (ParsePinned refuses any other), and a tag keeps its case (:V1 and :v1 are two
// tags).
func hostFolded(ref string) string {
	host, rest, ok := strings.Cut(ref, "/")
	if !ok {
		return ref
	}
	return strings.ToLower(host) + "/" + rest
}

// imagepinSelector is the selector of an imagepin.io set: spec.nodeSelector and the pool
// label, both required to match when both are given. With neither the set selects no
// node (as a v1 set without a pool does): a set of up to 2000 images should not land on
// every node by omission; nodeSelector {} says "every node" explicitly.
func imagepinSelector(ns *LabelSelector, labels map[string]string) (Selector, string, error) {
	pool, hasPool := labels[RoleLabel]
	if hasPool && pool == "" {
		return Selector{}, "", fmt.Errorf("metadata.labels[%s]: empty; name a pool (worker, master, ...) or remove the label", RoleLabel)
	}
	switch {
	case ns == nil && !hasPool:
		why := "no spec.nodeSelector and no " + RoleLabel + " label"
		return Nothing(why), "spec.nodeSelector: missing and no " + RoleLabel + " label, so the set applies to no node (nodeSelector: {} selects every node)", nil
	case ns == nil:
		sel, err := RoleSelector(pool)
		if err != nil {
			return Selector{}, "", fmt.Errorf("metadata.labels[%s]: %w", RoleLabel, err)
		}
		return sel, "", nil
	}
	merged := &LabelSelector{MatchLabels: ns.MatchLabels, MatchExpressions: ns.MatchExpressions}
	if hasPool {
		if _, err := RoleSelector(pool); err != nil {
			return Selector{}, "", fmt.Errorf("metadata.labels[%s]: %w", RoleLabel, err)
		}
		merged.MatchExpressions = append(slices.Clone(ns.MatchExpressions), LabelSelectorRequirement{Key: "node-role.kubernetes.io/" + pool, Operator: "Exists"})
	}
	sel, err := NewSelector(merged)
	if err != nil {
		return Selector{}, "", fmt.Errorf("spec.nodeSelector: %w", err)
	}
	return sel, "", nil
}

// yamlTypeError explains a text field that holds a boolean or a number: YAML 1.1 (which
// Kubernetes' YAML reading follows) reads unquoted y, yes, n, no, on, off, true and false
// as booleans and 0755 (octal), 1e3 or 12 as numbers. prefix is the field path of the
// decoded part ("" for the document, "spec." for its spec).
func yamlTypeError(err error, prefix string) error {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) || te.Type == nil || te.Type.Kind() != reflect.String {
		return err
	}
	field := prefix + te.Field
	what := "a number (0755 is octal 493; 1e3 is 1000)"
	if te.Value == "bool" {
		what = "a boolean (YAML 1.1 reads unquoted y, yes, n, no, on, off, true and false so)"
	}
	return fmt.Errorf("%s: an unquoted value was read as %s, not as text: put it in quotes (\"y\", \"0755\")", field, what)
}

// imageName accepts both element shapes: "ref" (the enhancement) and {name: ref} (v1).
func imageName(raw json.RawMessage) (string, error) {
	var str string
	if err := json.Unmarshal(raw, &str); err == nil {
		return str, nil
	}
	var obj struct {
		Name string `json:"name"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&obj); err != nil {
		return "", fmt.Errorf("must be an image reference or {name: reference}: %w", err)
	}
	if obj.Name == "" {
		return "", errors.New("name: missing")
	}
	return obj.Name, nil
}

// ValidateImage accepts only fully qualified references by sha256 digest, written in
// the canonical form CRI-O records (so the pin pattern matches the pulled name).
func ValidateImage(img string) error {
	if len(img) > 1024 {
		return fmt.Errorf("reference longer than 1024 characters")
	}
	ref, err := reference.ParseNamed(img)
	if err != nil {
		if errors.Is(err, reference.ErrNameNotCanonical) {
			norm, nerr := reference.ParseNormalizedNamed(img)
			if nerr == nil {
				return fmt.Errorf("%q is not fully qualified: write it as %q", img, norm.String())
			}
		}
		return fmt.Errorf("%q is not a valid image reference: %w", img, err)
	}
	digested, ok := ref.(reference.Digested)
	if !ok {
		return fmt.Errorf("%q is not by digest: pin images as repository@sha256:<64 hex digits>", img)
	}
	if _, tagged := ref.(reference.Tagged); tagged {
		return fmt.Errorf("%q has both a tag and a digest: write repository@sha256:… only", img)
	}
	d := digested.Digest()
	if d.Algorithm() != "sha256" || len(d.Encoded()) != 64 {
		return fmt.Errorf("%q: digest must be sha256 with 64 hex digits", img)
	}
	return nil
}

// DerivedUID is the uid of a set whose document has none: a name-based (version 5 style)
// UUID, the same on every node and every run.
func DerivedUID(name string) string {
	h := sha1.Sum([]byte("imagepin.pinnedimageset/" + name))
	h[6] = (h[6] & 0x0f) | 0x50
	h[8] = (h[8] & 0x3f) | 0x80
	x := hex.EncodeToString(h[:16])
	return x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
}

func specHash(selector string, images []string, tags []Tag, release, stream string) string {
	h := sha256.New()
	fmt.Fprintf(h, "selector=%s\n", selector)
	if release != "" {
		fmt.Fprintf(h, "release=%s\nstream=%s\n", release, stream)
	}
	for _, img := range images {
		fmt.Fprintf(h, "image=%s\n", img)
	}
	// Without tags the hash is what it was before sets could name them: a node keeps
	// the sets it had.
	for _, t := range tags {
		fmt.Fprintf(h, "tag=%s=%s\n", t.Name, t.Image)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
