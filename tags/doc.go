// Package tags is the pre-load of the tags the sets pin at run time on a node, as package
// peers is the node-local mirror's: it owns the lifecycle of the tag parts and what they
// report, and decides nothing the parts decide.
//
// Node holds the three parts the composition root builds for the runtime: the keeper
// (package tags/keep: the tags wanted, made held by the runtime), the check (package
// tags/check: which digest each tag names in its registry now) and, on CRI-O with [peers]
// tag_address, the node-local mirror's TLS endpoint for tags (package tags/endpoint). Run
// runs them until its context ends, the endpoint listening before the keeper's first
// pull (a pull of a tag while nothing listens would go on to the registry); an address
// another process holds becomes a fault of the node and nothing is pulled by tag, the
// rest of imagepind running on. Status is the tags for the node's status: how many the
// sets pin, how many the runtime holds, which moved in their registry, and the faults.
package tags
