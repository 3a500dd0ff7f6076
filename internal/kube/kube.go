// Package kube builds Kubernetes API clients from a kubeconfig, the same way for
// imagepind (the kubelet's kubeconfig) and imagepin-aggregator (in-cluster or a file).
package kube

import (
	"fmt"
	"os"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Config loads a kubeconfig; "" means the in-cluster service account. A kubeconfig that
// names its client certificate and key by file (the kubelet's kubelet-client-current.pem)
// is re-read by client-go every few minutes and its connections rotated, so a rotated
// certificate is used without a restart.
func Config(kubeconfig, userAgent string, qps float32, burst int) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster API config (or pass a kubeconfig): %w", err)
		}
	} else {
		if _, statErr := os.Stat(kubeconfig); statErr != nil {
			return nil, fmt.Errorf("kubeconfig: %w", statErr)
		}
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
	}
	cfg.UserAgent = userAgent
	cfg.QPS, cfg.Burst = qps, burst
	return cfg, nil
}
