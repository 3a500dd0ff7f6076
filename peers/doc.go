// Package peers is the node-local mirror at run time and the sharing of pinned images
// between nodes: one download from the registry per blob for the whole
// cluster.
//
// Node owns the mirror's run-time on a node (package mirror serves, peers decides what
// and from where): the pinned set, told by Node.Pinner after each successful pin write
// (a pin.Pinner decorator that keeps the runtime's capabilities) before the runtime's
// files point it at the mirror (Files: CRI-O's registries drop-in, containerd's
// hosts.toml blocks, rendered by those packages); the peers (Config.Nodes and those the
// aggregator hands out, FromAggregator); the pruning of the store after the pins change
// and, on containerd, once the runtime holds what was filled (Run); the loopback
// listener for the runtime, answering root and this process only (Serve), and the
// HTTPS server for the peers (ServePeers); the byte counters and their stamp on the
// node's status (Stamp). It takes a Config of its own; the composition root builds it
// from [peers] and starts Run, Serve and ServePeers under its errgroup.
//
// Each node's mirror fills what its store lacks through a Source. For every digest the
// nodes have one rendezvous order (Order: the same on every node); its first node, the
// head, is the one that fetches it from the registry, through the node's own access. A
// manifest is asked of the nodes in that order (this node's own turn being the
// registry). A blob comes down a tree laid over the order, Source.Fanout children a node
// (DefaultFanout 2): a node asks its parent, each node serving a blob while it arrives,
// so the tree is a pipeline and no node uploads a blob more than Fanout times while all
// are up. A node answering a peer fills a blob the same way: whole blobs are asked only
// of nodes before the asker in the blob's order, so requests never go round. A peer that
// fails, is slow or serves wrong bytes is set aside for a while (and left out of the
// trees) and the next node up the tree is asked, resuming with Range; what reaches the
// runtime is checked against its digest (containers/image checks again).
//
// Seeded content (package seed) may be on one node only, with no registry anywhere:
// each node says at HeldPath what its seeds hold, and a node whose turn would be the
// registry (the head of a blob's tree or of a manifest's order) asks a node holding it
// first, for what it holds only; the others get the digest from the nodes before them
// as from a registry, and ask no peer what it holds.
//
// Peers talk HTTPS with the nodes' certificates (Server: a client must present a node's
// client certificate of the cluster, CN system:node:<name>, O system:nodes), and a node
// serves a bounded number of requests at once, at a bounded rate.
package peers
