package wire

import (
	"github.com/sirupsen/logrus"
	"k8s.io/client-go/kubernetes"

	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/internal/kube"
	"github.com/imagepin/imagepin/nodecondition"
)

// NodeCondition is the writer of the node condition PinnedImagesReady on the node's own
// Node, with the kubelet's kubeconfig ([cluster] node_condition); nil with no
// [cluster] kubeconfig or node_condition = "off".
func NodeCondition(cfg conf.Config, version string, log logrus.FieldLogger) (*nodecondition.Writer, error) {
	if cfg.Cluster.Kubeconfig == "" || cfg.Cluster.NodeCondition == conf.NodeConditionOff {
		return nil, nil
	}
	nodeName, err := NodeName(cfg)
	if err != nil {
		return nil, err
	}
	mode := nodecondition.Ready
	if cfg.Cluster.NodeCondition == conf.NodeConditionRegistry {
		mode = nodecondition.RegistryIndependent
	}
	return nodecondition.New(nodecondition.Config{NodeName: nodeName, Mode: mode, Log: log}, func() (kubernetes.Interface, error) {
		rc, err := kube.Config(cfg.Cluster.Kubeconfig, "imagepind/"+version, 5, 10)
		if err != nil {
			return nil, err
		}
		return kubernetes.NewForConfig(rc)
	}), nil
}
