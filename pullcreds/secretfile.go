package pullcreds

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// maxSecretFile bounds what is read of a pull secret.
const maxSecretFile = 4 << 20

// SecretFile is the pull secret file (Path; "" or an absent file: no credentials). It is
// the one place the file is read: Lookup reads it again whenever it changes (by mtime
// and size), Reload reads it now; a file that cannot be read or parsed keeps the last
// good keyring. Safe for concurrent use.
type SecretFile struct {
	Path string

	mu      sync.Mutex
	stamp   [2]int64
	keyring *Keyring
}

// Lookup returns the credentials for an image from the current file (nil: none).
func (f *SecretFile) Lookup(image string) *Auth {
	f.mu.Lock()
	defer f.mu.Unlock()
	var stamp [2]int64
	if fi, err := os.Stat(f.Path); err == nil {
		stamp = [2]int64{fi.ModTime().UnixNano(), fi.Size()}
	}
	if f.keyring == nil || stamp != f.stamp {
		_, _ = f.reload(stamp) // an unreadable file keeps the last good keyring
	}
	return f.keyring.Lookup(image)
}

// Reload reads the file now and returns its keyring. When the file cannot be read or
// parsed, the error names the file (never its content) and the keyring is the last good
// one (empty before any).
func (f *SecretFile) Reload() (*Keyring, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var stamp [2]int64
	if fi, err := os.Stat(f.Path); err == nil {
		stamp = [2]int64{fi.ModTime().UnixNano(), fi.Size()}
	}
	return f.reload(stamp)
}

// reload reads the file, stamped with stamp when it parses. f.mu is held.
func (f *SecretFile) reload(stamp [2]int64) (*Keyring, error) {
	k, err := f.read()
	if err != nil {
		if f.keyring == nil {
			f.keyring = &Keyring{}
		}
		return f.keyring, err
	}
	f.keyring, f.stamp = k, stamp
	return k, nil
}

func (f *SecretFile) read() (*Keyring, error) {
	if f.Path == "" {
		return &Keyring{}, nil
	}
	data, err := fsutil.ReadRegular(f.Path, maxSecretFile)
	if errors.Is(err, os.ErrNotExist) {
		return &Keyring{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pull secret %s: %w", f.Path, err)
	}
	k, err := ParseKeyring(data)
	if err != nil {
		return nil, fmt.Errorf("pull secret %s: %w", f.Path, err)
	}
	return k, nil
}
