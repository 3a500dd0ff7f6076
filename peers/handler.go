package peers

import "net/http"

// Handler is the node-local mirror as Serve serves it to the runtime, for another
// endpoint of it (the TLS endpoint for tags, package tags/endpoint). Call it after Bind.
func (n *Node) Handler() http.Handler { return n.local }
