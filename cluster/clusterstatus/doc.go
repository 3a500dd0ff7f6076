// Package clusterstatus is the aggregator's side of the cluster loop. It watches the
// PinnedImageSet objects and the Nodes (client-go informers; Nodes as metadata only, the
// labels being all it needs), tells the report store which nodes each set targets (so a
// node that never received or never reported a set counts, as Unknown), and, on the
// leader only, writes each set's rollup into the object's status subresource.
//
// Writes are bounded whatever the node count: a set's status is written only when it
// changed, at most once per MinInterval, and all sets together at most QPS per second.
// A new leader writes nothing until every Node has reported or Warmup has passed, so a
// takeover does not publish a false Unknown or Degraded while nodes reconnect.
package clusterstatus
