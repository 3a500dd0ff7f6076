// Package imagepinv1 is the node → aggregator protocol: report.proto, the code protoc
// generates from it (make proto), and the conversions to and from the status model.
package imagepinv1
