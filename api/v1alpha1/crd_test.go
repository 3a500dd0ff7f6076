package v1alpha1_test

import (
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/imagepin/imagepin/api/v1alpha1"
	"github.com/imagepin/imagepin/pinset"
)

func schemaField(t *testing.T, path ...string) any {
	t.Helper()
	crd, err := v1alpha1.CRD()
	if err != nil {
		t.Fatal(err)
	}
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	if len(versions) != 1 {
		t.Fatalf("versions: %d", len(versions))
	}
	v, found, err := unstructured.NestedFieldNoCopy(versions[0].(map[string]any), path...)
	if err != nil || !found {
		t.Fatalf("%v: found=%v err=%v", path, found, err)
	}
	return v
}

// num reads a schema number (sigs.k8s.io/yaml decodes JSON numbers as float64).
func num(v any) int {
	switch n := v.(type) {
	case float64:
		return int(n)
	case int64:
		return int(n)
	}
	return -1
}

const specProps = "schema.openAPIV3Schema.properties.spec.properties"

func field(t *testing.T, dotted string) any {
	return schemaField(t, strings.Split(dotted, ".")...)
}

// The API server checks images with the CRD's pattern, imagepind with pinset.ValidateImage:
// an object the API admits must not fail on the node for its image names, and the
// other way round (a node must not pin what the API would refuse).
func TestCRDPatternAgreesWithConf(t *testing.T) {
	pattern := regexp.MustCompile(field(t, specProps+".releaseImage.pattern").(string))
	pinned := regexp.MustCompile(field(t, specProps+".pinnedImages.items.properties.name.pattern").(string))
	d := "@sha256:" + strings.Repeat("ab", 32)
	for _, img := range []string{
		"quay.io/openshift/release" + d,
		"quay.io/a/b/c/d" + d,
		"registry.example.com:5000/x" + d,
		"127.0.0.1:5000/imagepin/a" + d,
		"localhost/a" + d,
		"localhost:5000/a" + d,
		"registry:5000/a" + d,
		"[::1]:5000/a" + d,
		"Quay.IO/a" + d,
		"quay.io/a_b/c__d/e--f.g" + d,
		"quay.io/a" + d + "x",
		"quay.io/a:tag" + d,
		"registry.example.com:5000/x:v1.2_3-rc" + d,
		"quay.io/a:-tag" + d,
		"quay.io/a:" + strings.Repeat("t", 129) + d,
		"quay.io/a:tag",
		"quay.io/a",
		"ubuntu" + d,
		"library/ubuntu" + d,
		"registry/a" + d,
		"quay.io/A" + d,
		"quay.io/a@sha256:" + strings.Repeat("AB", 32),
		"quay.io/a@sha512:" + strings.Repeat("ab", 64),
		"quay.io/a@sha256:" + strings.Repeat("ab", 31),
		"quay.io//a" + d,
		"quay.io/a_" + d,
		"-quay.io/a" + d,
		"quay.io/a" + d + "\n",
		" quay.io/a" + d,
		"",
	} {
		byConf := pinset.ValidateImage(img) == nil
		byCRD := pattern.MatchString(img)
		if byConf != byCRD {
			t.Errorf("%q: conf accepts=%v, v1alpha1.CRD pattern accepts=%v", img, byConf, byCRD)
		}
		_, _, err := pinset.ParsePinned(img)
		if byPinned := pinned.MatchString(img); (err == nil) != byPinned {
			t.Errorf("%q: as a pinned image conf accepts=%v (%v), the CRD's pinnedImages pattern accepts=%v", img, err == nil, err, byPinned)
		}
	}
}

func TestCRDLimitsMatchConf(t *testing.T) {
	if got := field(t, specProps+".pinnedImages.maxItems"); num(got) != pinset.MaxImagesPerSet {
		t.Fatalf("maxItems %v, conf allows %d", got, pinset.MaxImagesPerSet)
	}
	if got := field(t, specProps+".pinnedImages.items.properties.name.maxLength"); num(got) != 1024 {
		t.Fatalf("maxLength %v", got)
	}
	if got := field(t, "schema.openAPIV3Schema.properties.status.properties.failingNodes.maxItems"); num(got) != v1alpha1.MaxFailingNodes {
		t.Fatalf("failingNodes maxItems %v", got)
	}
	cols := field(t, "additionalPrinterColumns").([]any)
	var names []string
	for _, c := range cols {
		names = append(names, c.(map[string]any)["name"].(string))
	}
	if got := strings.Join(names, ","); got != "Ready,Nodes,Failed,Unknown,Progress,Reason,Age" {
		t.Fatalf("printer columns %s", got)
	}
}
