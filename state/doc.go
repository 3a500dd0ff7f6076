// Package state keeps what imagepind must remember across restarts, in the state
// directory: each set file's last good content (so a file broken at restart still
// counts), when each pin was last wanted (so unpin_delay survives a restart), the last
// good node labels, which sets completed (uid + spec hash), and the lock that keeps
// imagepind and `imagepinctl apply` from running at once.
package state
