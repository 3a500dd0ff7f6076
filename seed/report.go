package seed

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/imagepin/imagepin/status"
)

// Report is what the node's status shows of its seeds (Status). The records are read
// again only when their directory changed (a record, or the seed directory's faults,
// written, renamed or removed there), or a minute passed.
type Report struct {
	dir, watched string

	mu    sync.Mutex
	mtime time.Time
	at    time.Time
	last  read
}

// read is what Report read last.
type read struct {
	recs  []*Record
	err   error // of the records
	media *MediaFaults
	merr  error // of the media faults
}

// NewReport reports the seeds recorded in dir (Dir(state_dir)), and the faults of the
// media of watched ([seed] directory; "": none watched).
func NewReport(dir, watched string) *Report {
	if watched != "" {
		watched = filepath.Clean(watched)
	}
	return &Report{dir: dir, watched: watched}
}

// Status is the node's complete seeds summed (nil: none), and its seeds' faults: a
// record that cannot be read (the store is not pruned then), the media of the watched
// directory refused or unreadable (MediaFaults), and the pinned references whose name a
// seed holds with another digest (Mismatches).
func (r *Report) Status(pinned []string) (*status.Seeded, []string) {
	rd := r.read()
	var faults []string
	if rd.err != nil {
		faults = append(faults, fmt.Sprintf("%v: the blob store is not pruned until it is fixed or removed", rd.err))
	}
	if rd.merr != nil {
		faults = append(faults, rd.merr.Error())
	}
	if rd.media != nil && r.watched != "" && rd.media.Directory == r.watched {
		for _, f := range rd.media.Media {
			faults = append(faults, f.String())
		}
	}
	for _, m := range Mismatches(rd.recs, pinned) {
		faults = append(faults, m.String())
	}
	t := tally(rd.recs)
	if t.Seeds == 0 {
		return nil, faults
	}
	return &status.Seeded{Seeds: t.Seeds, Images: t.Images, Bytes: t.Bytes}, faults
}

func (r *Report) read() read {
	r.mu.Lock()
	defer r.mu.Unlock()
	fi, err := os.Stat(r.dir)
	if err != nil {
		return read{} // no seed yet
	}
	// A read less than a second after the directory's last change may have missed a
	// change within the same tick of its timestamp: read again next time.
	fresh := !r.at.IsZero() && fi.ModTime().Equal(r.mtime) && r.at.Sub(r.mtime) >= time.Second && time.Since(r.at) < time.Minute
	if !fresh {
		r.mtime, r.at = fi.ModTime(), time.Now()
		r.last = read{}
		r.last.recs, r.last.err = Records(r.dir)
		r.last.media, r.last.merr = ReadMediaFaults(r.dir)
	}
	return r.last
}
