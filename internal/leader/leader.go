// Package leader runs a function only while this replica holds a coordination.k8s.io
// Lease (client-go leader election): two aggregator replicas, one leading.
package leader

import (
	"context"
	"errors"
	"time"

	"github.com/sirupsen/logrus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Config names the Lease and its timing (client-go's defaults: 15 s, 10 s, 2 s).
type Config struct {
	Namespace, Name, Identity           string
	LeaseDuration, RenewDeadline, Retry time.Duration
	Log                                 logrus.FieldLogger
}

// ErrLost means the lease was lost: the process should exit and start over as a standby,
// as Kubernetes controllers do, rather than risk two writers.
var ErrLost = errors.New("leader election lost")

// Run blocks until ctx ends or leadership is lost; lead runs while leading.
func Run(ctx context.Context, rc *rest.Config, cfg Config, lead func(ctx context.Context)) error {
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	return RunWith(ctx, client, cfg, lead)
}

// RunWith is Run on a client already built.
func RunWith(ctx context.Context, client kubernetes.Interface, cfg Config, lead func(ctx context.Context)) error {
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.Name},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity},
	}
	lost := false
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   cfg.LeaseDuration,
		RenewDeadline:   cfg.RenewDeadline,
		RetryPeriod:     cfg.Retry,
		ReleaseOnCancel: true,
		Name:            cfg.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				cfg.Log.WithField("identity", cfg.Identity).Info("leading")
				lead(ctx)
			},
			OnStoppedLeading: func() {
				if ctx.Err() == nil {
					lost = true
					cfg.Log.WithField("identity", cfg.Identity).Warn("leadership lost")
				}
			},
			OnNewLeader: func(id string) {
				if id != cfg.Identity {
					cfg.Log.WithField("leader", id).Info("standing by")
				}
			},
		},
	})
	if err != nil {
		return err
	}
	le.Run(ctx)
	if lost {
		return ErrLost
	}
	return nil
}
