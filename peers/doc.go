// Package peers shares pinned images between nodes (issue 24): one download from the
// registry per blob for the whole cluster.
//
// Each node's mirror (package mirror) fills what its store lacks through a Source that
// asks, for every manifest and blob, the nodes in rendezvous order of the digest
// (Order: the same order on every node, so they all ask the same node first): the
// first of them is the one node that fetches it from the registry, the others read it
// from that node while it arrives. This node's own turn in the order is the registry,
// through the node's own access. A peer that fails, is slow or serves wrong bytes is
// set aside for a while and the next in the order is asked, resuming with Range; what
// reaches the runtime is checked against its digest (containers/image checks again).
//
// Peers talk HTTPS with the nodes' certificates (Serve: a client must present a
// node's client certificate of the cluster, CN system:node:<name>, O system:nodes), and
// a node serves a bounded number of requests at once, at a bounded rate.
package peers
