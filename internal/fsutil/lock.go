package fsutil

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// ErrLocked means another process holds the lock TryLock asked for.
var ErrLocked = errors.New("locked by another process")

// TryLock takes an exclusive flock on path (created 0600), without waiting: ErrLocked
// when another process holds it. The lock goes with the returned func or when the
// process dies, so a kill -9 never leaves it held.
func TryLock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, ErrLocked
		}
		return nil, err
	}
	return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
}
