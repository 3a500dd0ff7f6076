{{/*
Labels every object of the chart carries beside its own.
*/}}
{{- define "imagepin.labels" -}}
app.kubernetes.io/part-of: imagepin
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "imagepin.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/*
The preset's paths for (runtime, distribution), as YAML. Every path is the host's, and
the DaemonSet mounts each at the same path in the container, so imagepind.toml names
what the runtime and the kubelet name.
*/}}
{{- define "imagepin.preset" -}}
{{- $d := .Values.distribution -}}
{{- $r := .Values.runtime -}}
{{- if not (has $r (list "crio" "containerd")) -}}
{{- fail (printf "runtime: must be crio or containerd, got %q" $r) -}}
{{- end -}}
{{- if not (has $d (list "generic" "k3s" "rke2" "openshift")) -}}
{{- fail (printf "distribution: must be generic, k3s, rke2 or openshift, got %q" $d) -}}
{{- end -}}
{{- if and (eq $d "openshift") (ne $r "crio") -}}
{{- fail (printf "runtime: openshift nodes run crio, got %q" $r) -}}
{{- end -}}
stateDir: /var/lib/imagepin
kubeletRootDir: /var/lib/kubelet
{{- if eq $d "openshift" }}
caCertsDir: /etc/pki
{{- else }}
caCertsDir: /etc/ssl/certs
{{- end }}
{{- if eq $r "crio" }}
criSocket: /run/crio/crio.sock
crioDir: /etc/crio
containersDir: /etc/containers
dbusSocket: /run/dbus/system_bus_socket
imageFs: /var/lib/containers/storage/overlay-images
{{- else if has $d (list "k3s" "rke2") }}
criSocket: /run/k3s/containerd/containerd.sock
containerdConfigPath: /var/lib/rancher/{{ $d }}/agent/etc/containerd/certs.d
imageFs: /var/lib/rancher/{{ $d }}/agent/containerd/io.containerd.snapshotter.v1.overlayfs
{{- else }}
criSocket: /run/containerd/containerd.sock
containerdConfigPath: /etc/containerd/certs.d
imageFs: /var/lib/containerd/io.containerd.snapshotter.v1.overlayfs
{{- end }}
{{- if eq $d "generic" }}
kubeletKubeconfig: /etc/kubernetes/kubelet.conf
kubeletCertDir: /var/lib/kubelet/pki
kubeletClientCert: /var/lib/kubelet/pki/kubelet-client-current.pem
kubeletServingCert: /var/lib/kubelet/pki/kubelet-server-current.pem
kubeletConfig: /var/lib/kubelet/config.yaml
kubeletConfigDir: "-"
kubeletPullSecret: "-"
{{- else if eq $d "openshift" }}
kubeletKubeconfig: /var/lib/kubelet/kubeconfig
kubeletCertDir: /var/lib/kubelet/pki
kubeletClientCert: /var/lib/kubelet/pki/kubelet-client-current.pem
kubeletServingCert: /var/lib/kubelet/pki/kubelet-server-current.pem
kubeletConfig: /etc/kubernetes/kubelet.conf
kubeletConfigDir: "-"
kubeletPullSecret: /var/lib/kubelet/config.json
{{- else }}
kubeletKubeconfig: /var/lib/rancher/{{ $d }}/agent/kubelet.kubeconfig
kubeletCertDir: /var/lib/rancher/{{ $d }}/agent
kubeletClientCert: /var/lib/rancher/{{ $d }}/agent/client-kubelet.crt
kubeletClientKey: /var/lib/rancher/{{ $d }}/agent/client-kubelet.key
kubeletServingCert: /var/lib/rancher/{{ $d }}/agent/serving-kubelet.crt
kubeletServingKey: /var/lib/rancher/{{ $d }}/agent/serving-kubelet.key
kubeletConfig: "-"
kubeletConfigDir: /var/lib/rancher/{{ $d }}/agent/etc/kubelet.conf.d
kubeletPullSecret: "-"
{{- end }}
{{- end }}

{{/*
The paths in effect: the preset's with .Values.paths over them; "-" means none ("").
*/}}
{{- define "imagepin.paths" -}}
{{- $p := include "imagepin.preset" . | fromYaml -}}
{{- range $k, $v := .Values.paths -}}
{{- if $v -}}{{- $_ := set $p $k $v -}}{{- end -}}
{{- end -}}
{{- range $k, $v := $p -}}
{{- if eq (toString $v) "-" -}}{{- $_ := set $p $k "" -}}{{- end -}}
{{- end -}}
{{- toYaml $p -}}
{{- end }}

{{/* The aggregator's Service name as nodes verify it. */}}
{{- define "imagepin.aggregatorHost" -}}
imagepin-aggregator.{{ .Release.Namespace }}.svc
{{- end }}

{{/* imagepind's config file in the container. */}}
{{- define "imagepin.configFile" -}}
/etc/imagepin/imagepind.toml
{{- end }}

{{/*
imagepind.toml as a dict: what the preset and the values give, with
.Values.imagepind.config merged over it.
*/}}
{{- define "imagepin.config" -}}
{{- $p := include "imagepin.paths" . | fromYaml -}}
{{- $v := .Values -}}
{{- $c := dict "state_dir" $p.stateDir "sets_dir" (printf "%s/sets.d" $p.stateDir) "status_file" "/run/imagepin/status.json" -}}
{{- $_ := set $c "node" (dict "labels_file" (printf "%s/node-labels.json" $p.stateDir)) -}}
{{- $_ := set $c "cri" (dict "endpoint" (printf "unix://%s" $p.criSocket) "pull_secret" $p.kubeletPullSecret "runtime" (ternary "cri-o" "containerd" (eq $v.runtime "crio"))) -}}
{{- if eq $v.runtime "crio" -}}
{{- $_ := set $c "crio" (dict "config" (printf "%s/crio.conf" $p.crioDir) "config_dir" (printf "%s/crio.conf.d" $p.crioDir) "reload" $v.imagepind.crioReload) -}}
{{- $_ := set $c "disk" (dict "registries_conf" (printf "%s/registries.conf" $p.containersDir) "registries_conf_dir" (printf "%s/registries.conf.d" $p.containersDir) "certs_dir" (printf "%s/certs.d" $p.containersDir) "kubelet_config" $p.kubeletConfig) -}}
{{- else -}}
{{- $_ := set $c "containerd" (dict "config_path" $p.containerdConfigPath) -}}
{{- $_ := set $c "disk" (dict "kubelet_config" $p.kubeletConfig) -}}
{{- end -}}
{{- $_ := set $c "kubelet" (dict "config_dir" $p.kubeletConfigDir "root_dir" $p.kubeletRootDir "binary" "") -}}
{{- $_ := set $c "cluster" (dict "kubeconfig" $p.kubeletKubeconfig) -}}
{{- $report := dict "cert" $p.kubeletClientCert "key" ($p.kubeletClientKey | default "") -}}
{{- $agg := $v.report.aggregator -}}
{{- if and (not $agg) $v.aggregator.enabled -}}
{{- $agg = printf "%s:9443" (include "imagepin.aggregatorHost" .) -}}
{{- end -}}
{{- if $agg -}}
{{- $_ := set $report "aggregator" $agg -}}
{{- $_ := set $report "server_name" ($v.report.serverName | default (include "imagepin.aggregatorHost" .)) -}}
{{- if $v.aggregator.enabled -}}
{{- $_ := set $report "ca" "/etc/imagepin-aggregator-ca/ca.crt" -}}
{{- end -}}
{{- end -}}
{{- $_ := set $c "report" $report -}}
{{- $peers := dict "enabled" $v.peers.enabled -}}
{{- if and $v.peers.enabled $v.peers.share -}}
{{- $_ := set $peers "address" (printf "0.0.0.0:%d" (int $v.peers.port)) -}}
{{- $_ := set $peers "cert" $p.kubeletServingCert -}}
{{- $_ := set $peers "key" ($p.kubeletServingKey | default "") -}}
{{- $_ := set $peers "ca" "/etc/imagepin-ca/serving-ca.crt" -}}
{{- $_ := set $peers "client_ca" "/etc/imagepin-ca/client-ca.crt" -}}
{{- end -}}
{{- $_ := set $c "peers" $peers -}}
{{- if $v.imagepind.metricsPort -}}
{{- $_ := set $c "metrics" (dict "address" (printf ":%d" (int $v.imagepind.metricsPort))) -}}
{{- end -}}
{{- include "imagepin.merge" (list $c (deepCopy $v.imagepind.config)) -}}
{{- toYaml $c -}}
{{- end }}

{{/*
merge sets each key of src (index . 1) in dst (index . 0), maps key by key: unlike
mergeOverwrite it also sets false, 0 and "".
*/}}
{{- define "imagepin.merge" -}}
{{- $dst := index . 0 -}}
{{- range $k, $v := index . 1 -}}
{{- if and (kindIs "map" $v) (kindIs "map" (index $dst $k)) -}}
{{- include "imagepin.merge" (list (index $dst $k) $v) -}}
{{- else -}}
{{- $_ := set $dst $k $v -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
ints makes whole float64s of a dict (how YAML numbers arrive) int64s, in place, so
that toToml writes 16 and not 16.0 (imagepind's integer keys refuse a float).
*/}}
{{- define "imagepin.ints" -}}
{{- $m := . -}}
{{- range $k, $v := $m -}}
{{- if kindIs "map" $v -}}
{{- include "imagepin.ints" $v -}}
{{- else if and (kindIs "float64" $v) (eq $v (floor $v)) -}}
{{- $_ := set $m $k (int64 $v) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The commands the uninstall hook gives imagepind: the mode and its readiness. */}}
{{- define "imagepin.uninstallCommand" -}}
{{ list "/usr/bin/imagepind" "uninstall" "--wait" (printf "--config=%s" (include "imagepin.configFile" .)) | toJson }}
{{- end }}
{{- define "imagepin.uninstallReady" -}}
{{ list "/usr/bin/imagepind" "uninstall" "--status" (printf "--config=%s" (include "imagepin.configFile" .)) | toJson }}
{{- end }}

{{/*
lookupData is one key of a ConfigMap in the cluster ("" when helm template cannot look,
or it is not there): (list namespace name key).
*/}}
{{- define "imagepin.lookupData" -}}
{{- $cm := lookup "v1" "ConfigMap" (index . 0) (index . 1) -}}
{{- index ($cm.data | default dict) (index . 2) | default "" -}}
{{- end }}

{{/* The CA bundle that signs the kubelets' client certificates. */}}
{{- define "imagepin.clientCA" -}}
{{- .Values.nodeIdentity.clientCA | default (include "imagepin.lookupData" (list "kube-system" "extension-apiserver-authentication" "client-ca-file")) -}}
{{- end }}

{{/* The CA bundle that signs the kubelets' serving certificates. */}}
{{- define "imagepin.servingCA" -}}
{{- if .Values.nodeIdentity.servingCA -}}
{{- .Values.nodeIdentity.servingCA -}}
{{- else if eq .Values.distribution "openshift" -}}
{{- include "imagepin.lookupData" (list "openshift-config-managed" "kubelet-serving-ca" "ca-bundle.crt") -}}
{{- else -}}
{{- include "imagepin.lookupData" (list "kube-system" "kube-root-ca.crt" "ca.crt") -}}
{{- end -}}
{{- end }}

{{/* Whether nodes share blobs with each other. */}}
{{- define "imagepin.sharing" -}}
{{- if and .Values.peers.enabled .Values.peers.share }}true{{ end -}}
{{- end }}
