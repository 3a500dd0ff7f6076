package conf

import (
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// The shipped sample config says "the values below are the defaults": every commented
// key, uncommented, decodes to exactly Default(), and a "0: N" note names the value 0
// stands for. (It once said pull_concurrency "0: 8" while the code's default was 64.)
func TestSampleConfigStatesTheDefaults(t *testing.T) {
	const sample = "../packaging/config/imagepind.toml"
	b, err := os.ReadFile(sample)
	if err != nil {
		t.Fatal(err)
	}
	key := regexp.MustCompile(`^#\s*([a-z_]+)\s*=\s*(.*)$`)
	var doc []string
	keys := 0
	for i, line := range strings.Split(string(b), "\n") {
		m := key.FindStringSubmatch(line)
		if m == nil {
			if strings.HasPrefix(strings.TrimSpace(line), "[") {
				line, _, _ = strings.Cut(line, "#")
			}
			doc = append(doc, line)
			continue
		}
		value, note, _ := strings.Cut(m[2], "#")
		value, note = strings.TrimSpace(value), strings.TrimSpace(note)
		if m[1] == "pull_concurrency" && !strings.HasPrefix(note, fmt.Sprintf("0: %d", DefaultPullConcurrency)) {
			t.Errorf("%s:%d: pull_concurrency's note %q does not say 0 means %d", sample, i+1, note, DefaultPullConcurrency)
		}
		doc = append(doc, m[1]+" = "+value)
		keys++
	}
	got := Default()
	if err := got.decode(strings.Join(doc, "\n")); err != nil {
		t.Fatalf("%s uncommented: %v", sample, err)
	}
	// An empty list or table in the sample is the default's nil.
	if len(got.Node.Labels) == 0 {
		got.Node.Labels = nil
	}
	if len(got.Peers.Nodes) == 0 {
		got.Peers.Nodes = nil
	}
	if want := Default(); !reflect.DeepEqual(got, want) {
		t.Fatalf("%s does not state the defaults:\n got  %+v\n want %+v", sample, got, want)
	}
	if keys < 40 {
		t.Fatalf("only %d keys read from %s: the test no longer reads the sample", keys, sample)
	}
}
