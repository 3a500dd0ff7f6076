package helm_test

import (
	"testing"
)

// make image's image holds the three binaries and nothing else: no CA certificates, no
// user database (its user is root), and its root filesystem is read-only in every pod.
// The chart gives each pod what that lacks: imagepind the node's CA certificates
// (read-only, at the node's path, where Go looks), the aggregator a non-root user by
// number, the uninstall hook's imagepinctl a writable /tmp.
func TestChartSuppliesWhatTheImageLacks(t *testing.T) {
	t.Run("imagepind: the node's CA certificates", func(t *testing.T) {
		for _, c := range []struct {
			name   string
			values map[string]any
			want   string
		}{
			{"crio-generic", preset{"crio", "generic"}.values(), "/etc/ssl/certs"},
			{"containerd-k3s", preset{"containerd", "k3s"}.values(), "/etc/ssl/certs"},
			{"crio-openshift", preset{"crio", "openshift"}.values(), "/etc/pki"},
			{"caCertsDir /etc/pki", map[string]any{"paths": map[string]any{"caCertsDir": "/etc/pki"}}, "/etc/pki"},
			{"caCertsDir -", map[string]any{"paths": map[string]any{"caCertsDir": "-"}}, ""},
		} {
			got := hostPaths(t, render(t, c.values))
			for _, dir := range []string{"/etc/ssl/certs", "/etc/pki"} {
				h, ok := got[dir]
				switch {
				case dir == c.want && (!ok || h != (hostPath{typ: "Directory", ro: true})):
					t.Errorf("%s: %s: %v %v, want mounted read-only, a Directory", c.name, dir, h, ok)
				case dir != c.want && ok:
					t.Errorf("%s: %s mounted, want only %q", c.name, dir, c.want)
				}
			}
		}
	})
	t.Run("aggregator: a non-root user by number", func(t *testing.T) {
		spec := get(render(t, nil).get(t, "Deployment imagepin/imagepin-aggregator"), "spec", "template", "spec")
		sc := get(spec, "securityContext")
		if get(sc, "runAsNonRoot") != true || get(sc, "runAsUser") != float64(65532) || get(sc, "runAsGroup") != float64(65532) {
			t.Errorf("aggregator pod securityContext %v: want runAsNonRoot with runAsUser and runAsGroup 65532", sc)
		}
		if get(spec, "containers", 0, "securityContext", "readOnlyRootFilesystem") != true {
			t.Error("aggregator: root filesystem not read-only")
		}
		// OpenShift's restricted SCC refuses a UID outside the namespace's range and
		// assigns one itself.
		spec = get(render(t, preset{"crio", "openshift"}.values()).get(t, "Deployment imagepin/imagepin-aggregator"), "spec", "template", "spec")
		if sc := get(spec, "securityContext"); get(sc, "runAsNonRoot") != true || get(sc, "runAsUser") != nil {
			t.Errorf("openshift: aggregator pod securityContext %v: want runAsNonRoot and no runAsUser", sc)
		}
	})
	t.Run("uninstall hook: a writable /tmp", func(t *testing.T) {
		spec := get(render(t, nil).get(t, "Job imagepin/imagepin-uninstall"), "spec", "template", "spec")
		sc := get(spec, "securityContext")
		if get(sc, "runAsUser") != float64(65532) || get(sc, "runAsGroup") != float64(65532) {
			t.Errorf("hook pod securityContext %v: want runAsUser and runAsGroup 65532", sc)
		}
		c := get(spec, "containers", 0)
		if get(c, "securityContext", "readOnlyRootFilesystem") != true {
			t.Error("hook: root filesystem not read-only")
		}
		vol := ""
		ms, _ := get(c, "volumeMounts").([]any)
		for _, m := range ms {
			if str(m, "mountPath") == "/tmp" && get(m, "readOnly") != true {
				vol = str(m, "name")
			}
		}
		found := false
		vs, _ := get(spec, "volumes").([]any)
		for _, v := range vs {
			found = found || (vol != "" && str(v, "name") == vol && get(v, "emptyDir") != nil)
		}
		if !found {
			t.Errorf("hook: no writable emptyDir at /tmp: %v", get(c, "volumeMounts"))
		}
	})
}
