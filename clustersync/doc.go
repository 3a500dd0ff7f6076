// Package clustersync brings a node's share of the cluster API down to files: the
// PinnedImageSet objects (imagepin.io/v1alpha1) into <sets_dir>/cluster/<name>.json,
// and the labels of the node's own Node object into the labels file. The sets directory
// stays the one interface of the node flow: the agent reads these files beside local
// ones and needs no API access of its own.
//
// It watches exactly two things, with client-go's list-and-watch machinery (a
// single-resource informer each, resuming from the last resourceVersion after a
// dropped watch): every PinnedImageSet (RBAC: get, list, watch for group system:nodes)
// and the one Node whose name is this node's (the node authorizer allows a node to
// list and watch itself with the field selector metadata.name=<node>). Nothing
// cluster-wide is cached.
//
// Faults never cost a pin: until the first complete list, and whenever the API is
// unreachable, the files stay as they were and Faults says why; an object the node
// cannot parse is still written, so the agent reports it (naming the file and field)
// and keeps the file's last good content.
package clustersync
