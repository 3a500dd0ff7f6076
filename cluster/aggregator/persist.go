package aggregator

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
)

var (
	reportsBucket = []byte("reports")
	// receivedBucket holds when each report was received (8 bytes, Unix nanoseconds).
	receivedBucket = []byte("received")
)

// Persister keeps the last report of every node in a bbolt file so that the page is not
// empty right after a restart. Heartbeats stay the truth: a restored report keeps the
// time it was really received (a node silent since before the restart is Unknown), and
// it does not count as reported for a new leader's warm-up until a live one follows. Writes are batched:
// the nodes that changed are flushed in one transaction every interval, not one fsync
// per report.
type Persister struct {
	db       *bolt.DB
	store    *Store
	interval time.Duration
	log      logrus.FieldLogger
}

// OpenPersister opens (or creates) the file.
func OpenPersister(path string, store *Store, interval time.Duration, log logrus.FieldLogger) (*Persister, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(reportsBucket); err != nil {
			return err
		}
		_, err := tx.CreateBucketIfNotExists(receivedBucket)
		return err
	}); err != nil {
		db.Close()
		return nil, err
	}
	return &Persister{db: db, store: store, interval: interval, log: log}, nil
}

// Load restores every stored report into the store, with the time it was received; a
// report that no longer parses or validates is skipped.
func (p *Persister) Load() (int, error) {
	n := 0
	err := p.db.View(func(tx *bolt.Tx) error {
		received := tx.Bucket(receivedBucket)
		return tx.Bucket(reportsBucket).ForEach(func(k, v []byte) error {
			var r v1.NodeReport
			if err := proto.Unmarshal(v, &r); err != nil {
				p.log.WithField("node", string(k)).WithError(err).Warn("stored report skipped")
				return nil
			}
			t := received.Get(k)
			if len(t) != 8 {
				p.log.WithField("node", string(k)).Warn("stored report skipped: no receive time")
				return nil
			}
			if _, err := p.store.restore(string(k), &r, time.Unix(0, int64(binary.BigEndian.Uint64(t))).UTC()); err != nil {
				p.log.WithField("node", string(k)).WithError(err).Warn("stored report skipped")
				return nil
			}
			n++
			return nil
		})
	})
	p.store.takeDirty() // what was just loaded is stored already
	return n, err
}

// Run flushes every interval until ctx ends, then flushes once more and closes.
func (p *Persister) Run(ctx context.Context) error {
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			err := p.Flush()
			p.db.Close()
			return err
		case <-t.C:
			if err := p.Flush(); err != nil {
				p.log.WithError(err).Error("persist reports")
			}
		}
	}
}

// Flush writes the reports that changed since the last flush, in one transaction.
func (p *Persister) Flush() error {
	dirty := p.store.takeDirty()
	if len(dirty) == 0 {
		return nil
	}
	return p.db.Update(func(tx *bolt.Tx) error {
		b, rb := tx.Bucket(reportsBucket), tx.Bucket(receivedBucket)
		for node, st := range dirty {
			if st.report == nil { // forgotten
				if err := b.Delete([]byte(node)); err != nil {
					return err
				}
				if err := rb.Delete([]byte(node)); err != nil {
					return err
				}
				continue
			}
			data, err := proto.Marshal(st.report)
			if err != nil {
				return err
			}
			if err := b.Put([]byte(node), data); err != nil {
				return err
			}
			if err := rb.Put([]byte(node), binary.BigEndian.AppendUint64(nil, uint64(st.received.UnixNano()))); err != nil {
				return err
			}
		}
		return nil
	})
}
