package wire

import (
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/status"
)

// Publisher takes each new node status the agent computes.
type Publisher func(status.Node)

// Publish hands a status to every publisher, in the order given: the daemon's list is
// the status file, sd_notify's STATUS=, the metrics, and the reporter to the aggregator.
// Nil entries (a part switched off) are skipped.
func Publish(pubs ...Publisher) func(status.Node) {
	var on []Publisher
	for _, p := range pubs {
		if p != nil {
			on = append(on, p)
		}
	}
	return func(n status.Node) {
		for _, p := range on {
			p(n)
		}
	}
}

// StatusFile writes each status to path atomically ([status] file); a failed write is
// logged and the next status tries again.
func StatusFile(path string, log logrus.FieldLogger) Publisher {
	return func(n status.Node) {
		if err := status.WriteFile(path, n); err != nil {
			log.WithError(err).WithField("file", path).Error("write status file")
		}
	}
}
