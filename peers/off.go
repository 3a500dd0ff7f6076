package peers

import (
	"errors"
	"os"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
)

// Leftovers are what the node-local mirror leaves on a node while [peers] is on: what
// Off removes once it is off.
type Leftovers struct {
	// Store is the blob store's directory ([peers] store_dir, else the state
	// directory's).
	Store string
	// Files are the runtime's files that point it at the mirror, each rendered for no
	// pins to take the mirror out (Files.Render(nil)): CRI-O's registries drop-in
	// (crio.MirrorRegistries), containerd's hosts.toml blocks (containerd.MirrorHosts).
	// Both runtimes' may be given: Off runs before the runtime is known, and the other
	// runtime's files are simply not there.
	Files []Files
	// Untrust, when not nil, takes back the trust CRI-O was given in the CA of the
	// mirror's TLS endpoint for tags (endpoint.Forget).
	Untrust func() error
}

// Off removes what the node-local mirror left while [peers] was on, on a node that now
// runs with it off: the runtime's files no longer name the mirror, CRI-O no longer
// trusts the tag endpoint's CA, and the store is removed, only when imagepind made it
// and only what it holds ([peers] store_dir may name any directory: one imagepind never
// made a store of is left as it is). The mirror being gone makes the runtime go on to
// the next endpoint anyway; Off leaves nothing naming it. Each failure is logged, and
// none stops imagepind: the next start tries again.
func Off(l Leftovers, log logrus.FieldLogger) {
	for _, f := range l.Files {
		switch changed, err := f.Render(nil); {
		case err != nil:
			log.WithError(err).Warn("[peers] is off: taking the node-local mirror out of the runtime's files")
		case changed:
			log.Info("[peers] is off: the runtime's files no longer name the node-local mirror")
		}
	}
	if l.Untrust != nil {
		if err := l.Untrust(); err != nil {
			log.WithError(err).Warn("[peers] is off: removing the tag endpoint's CA from certs.d")
		}
	}
	if _, err := os.Stat(l.Store); err != nil {
		return
	}
	switch err := blobstore.Remove(l.Store); {
	case err == nil:
		log.WithField("dir", l.Store).Info("[peers] is off: removed the node-local mirror's blob store")
	case errors.Is(err, blobstore.ErrNotAStore):
		log.WithField("dir", l.Store).Debug("[peers] is off: store_dir holds no blob store imagepind made; left as it is")
	default:
		log.WithError(err).WithField("dir", l.Store).Warn("[peers] is off: removing the node-local mirror's blob store")
	}
}
