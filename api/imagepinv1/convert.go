package imagepinv1

import (
	"time"

	"github.com/imagepin/imagepin/status"
)

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// FromStatus builds a report of a node's status.
func FromStatus(n status.Node, bootID string, sequence uint64, heartbeat time.Duration) *NodeReport {
	r := &NodeReport{
		Node: n.Node.Name, BootId: bootID, Sequence: sequence, HeartbeatMillis: uint32(heartbeat / time.Millisecond),
		UpdatedUnixNano: unixNano(n.Updated),
		Info: &NodeInfo{
			Architecture: n.Node.Architecture, Version: n.Node.Version,
			RuntimeName: n.Node.Runtime.Name, RuntimeVersion: n.Node.Runtime.Version,
			ImageFsPath: n.Node.ImageFilesystem.Path, ImageFsCapacityBytes: n.Node.ImageFilesystem.CapacityBytes,
			ImageFsFreeBytes: n.Node.ImageFilesystem.FreeBytes,
		},
		Faults: n.Faults,
	}
	if p := n.Node.Peers; p != nil {
		r.Info.PeerAddress, r.Info.PeerFromRegistryBytes, r.Info.PeerFromPeersBytes = p.Address, p.FromRegistry, p.FromPeers
		r.Info.PeerToPeersBytes, r.Info.PeerStoredBytes = p.ToPeers, p.Stored
	}
	for _, s := range n.Sets {
		ps := &SetStatus{
			Name: s.Name, Uid: s.UID, SpecHash: s.SpecHash, File: s.File, Phase: string(s.Phase),
			ImagesTotal: uint32(s.ImagesTotal), ImagesReady: uint32(s.ImagesReady), BytesTotal: s.BytesTotal, BytesReady: s.BytesReady,
			BytesFromRegistry: s.BytesFromRegistry,
		}
		if s.Release != nil {
			ps.ReleaseImage, ps.ReleaseVersion, ps.ReleaseImages, ps.ReleaseError = s.Release.Image, s.Release.Version, uint32(s.Release.Images), s.Release.Error
		}
		for _, c := range s.Conditions {
			ps.Conditions = append(ps.Conditions, &Condition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message,
				LastTransitionUnixNano: unixNano(c.LastTransitionTime)})
		}
		for _, f := range s.FailedImages {
			ps.FailedImages = append(ps.FailedImages, &FailedImage{Image: f.Image, Reason: f.Reason, Error: f.Error})
		}
		r.Sets = append(r.Sets, ps)
	}
	for _, fe := range n.FileErrors {
		r.FileErrors = append(r.FileErrors, &FileError{File: fe.File, Error: fe.Error})
	}
	r.Blobs = FromBlobs(n.Blobs)
	return r
}

// ToStatus turns a report back into the status model, without its blobs (the
// aggregator keeps those its own way).
func (r *NodeReport) ToStatus() status.Node {
	n := status.Node{Updated: fromUnixNano(r.GetUpdatedUnixNano()), Faults: r.GetFaults(), Sets: []status.Set{}}
	info := r.GetInfo()
	n.Node = status.NodeInfo{
		Name: r.GetNode(), Architecture: info.GetArchitecture(), Version: info.GetVersion(),
		Runtime:         status.Runtime{Name: info.GetRuntimeName(), Version: info.GetRuntimeVersion()},
		ImageFilesystem: status.ImageFilesystem{Path: info.GetImageFsPath(), CapacityBytes: info.GetImageFsCapacityBytes(), FreeBytes: info.GetImageFsFreeBytes()},
	}
	if info.GetPeerAddress() != "" || info.GetPeerFromRegistryBytes() != 0 || info.GetPeerStoredBytes() != 0 {
		n.Node.Peers = &status.PeerBytes{Address: info.GetPeerAddress(), FromRegistry: info.GetPeerFromRegistryBytes(), FromPeers: info.GetPeerFromPeersBytes(),
			ToPeers: info.GetPeerToPeersBytes(), Stored: info.GetPeerStoredBytes()}
	}
	for _, ps := range r.GetSets() {
		s := status.Set{
			Name: ps.GetName(), UID: ps.GetUid(), SpecHash: ps.GetSpecHash(), File: ps.GetFile(), Phase: status.Phase(ps.GetPhase()),
			ImagesTotal: int(ps.GetImagesTotal()), ImagesReady: int(ps.GetImagesReady()), BytesTotal: ps.GetBytesTotal(), BytesReady: ps.GetBytesReady(),
			BytesFromRegistry: ps.GetBytesFromRegistry(),
		}
		if ps.GetReleaseImage() != "" {
			s.Release = &status.Release{Image: ps.GetReleaseImage(), Version: ps.GetReleaseVersion(), Images: int(ps.GetReleaseImages()), Error: ps.GetReleaseError()}
		}
		for _, c := range ps.GetConditions() {
			s.Conditions = append(s.Conditions, status.Condition{Type: c.GetType(), Status: c.GetStatus(), Reason: c.GetReason(),
				Message: c.GetMessage(), LastTransitionTime: fromUnixNano(c.GetLastTransitionUnixNano())})
		}
		for _, f := range ps.GetFailedImages() {
			s.FailedImages = append(s.FailedImages, status.FailedImage{Image: f.GetImage(), Reason: f.GetReason(), Error: f.GetError()})
		}
		n.Sets = append(n.Sets, s)
	}
	for _, fe := range r.GetFileErrors() {
		n.FileErrors = append(n.FileErrors, status.FileError{File: fe.GetFile(), Error: fe.GetError()})
	}
	return n
}
