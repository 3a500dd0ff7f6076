package clustersync

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/imagepin/imagepin/api/v1alpha1"
	"github.com/imagepin/imagepin/internal/fsutil"
	"github.com/imagepin/imagepin/pinset"
)

// writeSets makes the cluster subdirectory hold exactly the objects: changed files are
// replaced atomically, files of deleted objects removed (the agent unpins them after
// unpin_delay). A missing sets directory is a sync fault of its own: nothing is created
// in its place, so the agent keeps seeing the fault rather than an empty directory. It
// says whether the directory is in step.
func (s *Syncer) writeSets(objs []any) bool {
	if st, err := os.Stat(s.cfg.SetsDir); err != nil || !st.IsDir() {
		s.setFault("write", fmt.Sprintf("cluster sync: sets directory %s is missing: not writing cluster sets", s.cfg.SetsDir))
		return false
	}
	dir := s.Dir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		s.setFault("write", fmt.Sprintf("cluster sync: %v", err))
		return false
	}
	want := map[string][]byte{}
	var problems []string
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		name := u.GetName()
		if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
			problems = append(problems, fmt.Sprintf("PinnedImageSet %q: metadata.name: %s", name, strings.Join(msgs, "; ")))
			continue
		}
		data, err := v1alpha1.NodeDocument(u)
		if err != nil {
			problems = append(problems, fmt.Sprintf("PinnedImageSet %s: %v", name, err))
			continue
		}
		want[pinset.ClusterFileName(name)] = data
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		s.setFault("write", fmt.Sprintf("cluster sync: %v", err))
		return false
	}
	have := map[string]bool{}
	for _, e := range entries {
		n := e.Name()
		switch {
		case strings.HasPrefix(n, ".") && strings.Contains(n, ".tmp-"):
			_ = os.Remove(filepath.Join(dir, n)) // a temp file left by a kill -9
		case pinset.IsSetFileName(n) && want[n] == nil:
			if err := fsutil.RemoveDurable(filepath.Join(dir, n)); err != nil {
				problems = append(problems, err.Error())
			} else {
				s.cfg.Log.WithField("file", pinset.ClusterSubdir+"/"+n).Info("set deleted in the API: file removed")
			}
		default:
			have[n] = true
		}
	}
	for n, data := range want {
		p := filepath.Join(dir, n)
		if have[n] {
			if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, data) {
				continue
			}
		}
		if err := fsutil.WriteAtomic(p, "", data, 0o644); err != nil {
			problems = append(problems, err.Error())
			continue
		}
		s.cfg.Log.WithField("file", pinset.ClusterSubdir+"/"+n).Info("set from the API written")
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		s.setFault("write", "cluster sync: "+strings.Join(problems, "; "))
		return false
	}
	s.setFault("write", "")
	return true
}

// writeLabels writes the Node's labels to the labels file when they change. No Node of
// this name keeps the last labels and says how to fix it. It says whether the file
// holds the Node's labels now.
func (s *Syncer) writeLabels(objs []any) bool {
	var node *metav1.PartialObjectMetadata
	for _, o := range objs {
		if m, ok := o.(*metav1.PartialObjectMetadata); ok && m.Name == s.cfg.NodeName {
			node = m
		}
	}
	if node == nil {
		s.setFault("labels", fmt.Sprintf("cluster API: no Node named %q: keeping the last labels (set [node] name to the kubelet's node name)", s.cfg.NodeName))
		return false
	}
	labels := node.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	data, err := json.MarshalIndent(labels, "", "  ")
	if err != nil {
		s.setFault("labels", err.Error())
		return false
	}
	data = append(data, '\n')
	if old, err := os.ReadFile(s.cfg.LabelsFile); err == nil && bytes.Equal(old, data) {
		s.setFault("labels", "")
		return true
	}
	if err := os.MkdirAll(filepath.Dir(s.cfg.LabelsFile), 0o755); err != nil {
		s.setFault("labels", fmt.Sprintf("cluster sync: labels file: %v", err))
		return false
	}
	if err := fsutil.WriteAtomic(s.cfg.LabelsFile, "", data, 0o644); err != nil {
		s.setFault("labels", fmt.Sprintf("cluster sync: labels file: %v", err))
		return false
	}
	s.cfg.Log.WithField("file", s.cfg.LabelsFile).Info("node labels from the API written")
	s.setFault("labels", "")
	return true
}
