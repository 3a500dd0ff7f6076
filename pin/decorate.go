package pin

// Decorated is outer (a Pinner that wraps inner, replacing some of its methods) with
// every named capability of inner: a wrapper built by embedding Pinner hides
// Watcher and RecordPinner, which the agent finds by type assertion (a containerd
// pinner behind it would stop following the runtime's events and pin names instead of
// records). A new capability interface is added here too (TestDecoratedKeeps...).
func Decorated(outer, inner Pinner) Pinner {
	w, watches := inner.(Watcher)
	r, records := inner.(RecordPinner)
	switch {
	case watches && records:
		return struct {
			Pinner
			Watcher
			RecordPinner
		}{outer, w, r}
	case watches:
		return struct {
			Pinner
			Watcher
		}{outer, w}
	case records:
		return struct {
			Pinner
			RecordPinner
		}{outer, r}
	}
	return outer
}
