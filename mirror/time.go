package mirror

import "time"

// zeroTime: blobs have no modification time worth a Last-Modified header.
var zeroTime time.Time
