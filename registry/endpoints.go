package registry

import (
	"strings"
	"sync"

	"github.com/sirupsen/logrus"
)

// EndpointRecorder learns which endpoint served each image. containers/image says which
// endpoint it tries only in a log line ("Trying to access \"mirror/repo@sha256:…\"",
// with Config.LogEndpoints), tried in order until one answers; the last one
// tried for a digest that resolved is the one that answered. Install it as a hook on
// logrus' standard logger, which containers/image logs to.
type EndpointRecorder struct {
	mu   sync.Mutex
	last map[string]string // digest → endpoint reference
}

// NewEndpointRecorder returns an empty recorder.
func NewEndpointRecorder() *EndpointRecorder { return &EndpointRecorder{last: map[string]string{}} }

// Levels implements logrus.Hook.
func (r *EndpointRecorder) Levels() []logrus.Level { return logrus.AllLevels }

// Fire implements logrus.Hook.
func (r *EndpointRecorder) Fire(e *logrus.Entry) error {
	const prefix = `Trying to access "`
	if !strings.HasPrefix(e.Message, prefix) {
		return nil
	}
	ref := strings.TrimSuffix(strings.TrimPrefix(e.Message, prefix), `"`)
	if i := strings.LastIndex(ref, "@"); i > 0 {
		r.mu.Lock()
		r.last[ref[i+1:]] = ref
		r.mu.Unlock()
	}
	return nil
}

// Endpoint is the repository that served image, "" when unknown.
func (r *EndpointRecorder) Endpoint(image string) string {
	i := strings.LastIndex(image, "@")
	if i < 0 {
		return ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ref := r.last[image[i+1:]]
	if j := strings.LastIndex(ref, "@"); j > 0 {
		return ref[:j]
	}
	return ref
}
