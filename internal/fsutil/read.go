package fsutil

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// ErrNotRegular is returned for FIFOs, devices, sockets and directories.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is returned for a file over the caller's limit.
var ErrTooLarge = errors.New("file too large")

// ReadRegular reads a regular file of at most max bytes. Symlinks are followed (a
// ConfigMap volume is made of them) but what they lead to must be a regular file. The
// open is non-blocking so that a FIFO cannot hang the caller.
func ReadRegular(path string, max int64) ([]byte, error) {
	f, fi, err := OpenRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi.Size() > max {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, fi.Size(), max)
	}
	// The size may change under us (a sync still writing): never read past max.
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, max)
	}
	return data, nil
}

// OpenRegular opens a regular file for reading, and says what it is. Symlinks are
// followed, but what they lead to must be a regular file. The open is non-blocking, so
// that a FIFO cannot hang the caller, and the check is made on the file opened, so that
// nothing swapped in between can be read.
func OpenRegular(path string) (*os.File, os.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%w (%s)", ErrNotRegular, describeMode(fi.Mode()))
	}
	return f, fi, nil
}

func describeMode(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a block device"
	case m&os.ModeSocket != 0:
		return "a socket"
	}
	return m.Type().String()
}
