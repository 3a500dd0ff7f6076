// Package report sends a node's status to the aggregator over gRPC with mTLS (the
// kubelet's client certificate by default): on every change and as a heartbeat. It
// keeps only the latest status, never a queue: while the aggregator is down imagepind
// goes on working, and the latest state goes out when it is back.
package report
