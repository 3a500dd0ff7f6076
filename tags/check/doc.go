// Package check asks the registry, while it answers, which digest each pinned tag
// names now, and reports the tags that moved: the set still pins its digest, and that
// is what the node keeps and serves until the set changes. Each tag is asked when a set
// first names it, then every Config.Every, a bounded number at a time, through the
// node's own registry access and credentials (never through the node-local mirror,
// which answers a pinned tag with the pinned digest). A registry that does not answer
// changes nothing that was known.
package check
