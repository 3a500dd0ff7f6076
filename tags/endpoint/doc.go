// Package endpoint is the node-local mirror's TLS endpoint for tags: the only
// endpoint CRI-O asks for tags (crio.MirrorRegistries writes it as a tag-only mirror,
// never insecure), answering only the tags the sets pin (mirror.WithTags).
//
// A tag, unlike a digest, cannot be checked by the client: whoever answers it chooses
// the image. So the endpoint must be one no other local process can stand in for,
// even while imagepind is down and its port is free. It speaks TLS with a certificate
// from a node-local CA whose key only imagepind holds (mode 0600 in its state
// directory); CRI-O trusts that CA for exactly this host:port, through the certs.d
// directory it reads (<certs.d>/<host:port>/ca.crt). A process bound to the port in
// imagepind's absence cannot complete the handshake, and CRI-O goes on to the
// registry; a refused connection does the same.
package endpoint
