// Package aggregator is the cluster-side service nodes report to. It keeps each node's
// newest report (by the node's boot id and sequence, not by clock), takes each node's
// identity from its TLS client certificate (the kubelet's own, CN system:node:<name>),
// and rolls the reports up per set: which nodes are ready, which fail and why, which are
// progressing (with an ETA), which went silent. The read side is plain HTTP JSON,
// Prometheus metrics and a health check, on a separate listener.
//
// Its truth is what nodes re-send on their heartbeat: a restart loses nothing that the
// next heartbeat does not restore.
package aggregator
