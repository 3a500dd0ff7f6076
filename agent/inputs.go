package agent

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"time"

	"github.com/imagepin/imagepin/internal/fsutil"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/status"
)

func (a *Agent) loadState() error {
	d, err := a.deps.State.Load()
	a.in.data = d
	if a.in.data.Pins == nil {
		a.in.data.Pins = map[string]time.Time{}
	}
	for img, released := range a.in.data.Pins {
		if !released.IsZero() {
			a.sched.set(unpinKey(img), released.Add(a.cfg.UnpinDelay))
		}
	}
	return err
}

func (a *Agent) saveState() {
	if !a.in.dataDirty {
		return
	}
	if err := a.deps.State.Save(a.in.data); err != nil {
		a.log.WithError(err).Error("save state")
		return
	}
	a.in.dataDirty = false
}

// loadInputs reads the set files, the labels file and the pull secret. A file that fails
// keeps its last good content; a missing sets directory or a broken labels file is a
// sync fault that keeps what was there.
func (a *Agent) loadInputs() {
	a.in.inputFaults = nil
	if a.deps.SourceFaults != nil {
		a.in.inputFaults = append(a.in.inputFaults, a.deps.SourceFaults()...)
	}
	a.in.waitingForSync = a.deps.SourceSynced != nil && !a.deps.SourceSynced()
	a.loadSets()
	a.loadLabels()
	k, err := a.in.secret.Reload()
	if err != nil {
		a.in.inputFaults = append(a.in.inputFaults, err.Error()+"; keeping the previous credentials")
	} else {
		a.in.keyring = k
	}
}

func (a *Agent) loadSets() {
	files, err := pinset.ReadSetsDir(a.cfg.SetsDir, a.cfg.ClusterSync)
	var replay []string // last good contents read in place of files that are not there
	switch {
	case errors.Is(err, pinset.ErrClusterDirMissing):
		// The local files are read as usual; the cluster sets keep their last good
		// contents until the cluster sync puts the directory back.
		a.in.inputFaults = append(a.in.inputFaults, fmt.Sprintf("%v: keeping the cluster sets' last good contents until the cluster sync restores it; nothing is unpinned", err))
		a.log.WithError(err).Warn("cluster subdirectory missing: keeping the cluster sets")
		for _, name := range a.deps.State.GoodNames() {
			if pinset.IsClusterFile(name) {
				replay = append(replay, name)
			}
		}
		err = nil
	case err != nil:
		a.in.inputFaults = append(a.in.inputFaults, fmt.Sprintf("%v: keeping the current sets; nothing is unpinned", err))
		a.log.WithError(err).Warn("sets directory unreadable: keeping the current sets")
		if a.in.setsLoaded {
			return
		}
		// First load after a restart: the sets are those of the last good contents.
		replay = a.deps.State.GoodNames()
	}
	for _, name := range replay {
		files = append(files, pinset.SetFile{Name: name, Err: errors.New("not readable now")})
	}
	// A replay takes files in exactly the order a live read does: the same file wins a
	// name clash after a restart as before it.
	pinset.SortSetFiles(files)
	a.in.setsLoaded = true
	present := map[string]bool{}
	var perFile []pinset.FileSets
	var fileErrors []status.FileError
	for _, f := range files {
		present[f.Name] = true
		var res pinset.ParseResult
		var perr error
		if f.Err != nil {
			perr = fmt.Errorf("%s: %w", f.Name, f.Err)
		} else {
			res, perr = pinset.ParseSetFile(f.Name, f.Data)
		}
		if perr == nil {
			if err := a.deps.State.SaveGood(f.Name, f.Data); err != nil {
				a.log.WithError(err).WithField("file", f.Name).Error("save last good content")
			}
			for _, w := range res.Warnings {
				a.log.WithField("file", f.Name).Warn(w)
			}
			perFile = append(perFile, pinset.FileSets{File: f.Name, Sets: res.Sets})
			continue
		}
		msg := perr.Error()
		if good, ok := a.deps.State.Good(f.Name); ok {
			if res, err := pinset.ParseSetFile(f.Name, good); err == nil {
				perFile = append(perFile, pinset.FileSets{File: f.Name, Sets: res.Sets})
				msg += "; using the file's last good content"
			}
		}
		a.log.WithField("file", f.Name).Warn(msg)
		fileErrors = append(fileErrors, status.FileError{File: f.Name, Error: msg})
	}
	if err == nil {
		// Files deleted from the directory are gone for good.
		for _, name := range a.deps.State.GoodNames() {
			if !present[name] {
				if err := a.deps.State.Forget(name); err != nil {
					a.log.WithError(err).Warn("forget deleted file")
				}
			}
		}
	}
	kept, dupErrs := pinset.UniqueNames(perFile)
	for file, e := range dupErrs {
		fileErrors = append(fileErrors, status.FileError{File: file, Error: e.Error()})
	}
	a.in.sets = a.in.sets[:0]
	for _, f := range kept {
		a.in.sets = append(a.in.sets, f.Sets...)
	}
	sortFileErrors(fileErrors)
	a.in.fileErrors = fileErrors
}

func (a *Agent) loadLabels() {
	var fileLabels map[string]string
	if a.cfg.LabelsFile != "" {
		data, err := fsutil.ReadRegular(a.cfg.LabelsFile, pinset.MaxLabelsFileSize)
		switch {
		case errors.Is(err, os.ErrNotExist) && a.in.data.Labels == nil:
			// Never had a labels file: inline labels only.
		case errors.Is(err, os.ErrNotExist):
			a.in.inputFaults = append(a.in.inputFaults, fmt.Sprintf("labels file %s disappeared: keeping its last good labels (write {} to clear them)", a.cfg.LabelsFile))
			fileLabels = a.in.data.Labels
		case err != nil:
			a.in.inputFaults = append(a.in.inputFaults, fmt.Sprintf("labels file %s: %v: keeping its last good labels", a.cfg.LabelsFile, err))
			fileLabels = a.in.data.Labels
		default:
			l, perr := pinset.ParseLabelsFile(data)
			if perr != nil {
				a.in.inputFaults = append(a.in.inputFaults, fmt.Sprintf("labels file %s: %v: keeping its last good labels", a.cfg.LabelsFile, perr))
				fileLabels = a.in.data.Labels
			} else {
				fileLabels = l
				if !maps.Equal(a.in.data.Labels, l) {
					a.in.data.Labels = l
					a.in.dataDirty = true
				}
			}
		}
	}
	labels := pinset.MergeLabels(a.cfg.InlineLabels, fileLabels)
	if !maps.Equal(labels, a.in.labels) {
		a.log.WithField("labels", labelString(labels)).Info("node labels")
	}
	a.in.labels = labels
}

// desiredSets are the sets whose selector matches this node, in name order.
func (in *inputs) desiredSets() []pinset.Set {
	var out []pinset.Set
	for _, s := range in.sets {
		if s.Selector.Matches(in.labels) {
			out = append(out, s)
		}
	}
	sortSets(out)
	return out
}

func labelString(l map[string]string) string {
	var parts []string
	for k, v := range l {
		parts = append(parts, k+"="+v)
	}
	sortStrings(parts)
	return strings.Join(parts, ",")
}
