package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
	"github.com/imagepin/imagepin/cluster/aggregator"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/testcerts"
)

// fakeRuntime answers CRI's Version; fakeImages the image calls check makes: every image
// in ids present and pinned, listed under its name.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
}

func (fakeRuntime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "cri-o", RuntimeVersion: "1.34.0"}, nil
}

type fakeImages struct {
	runtimeapi.UnimplementedImageServiceServer
	ids map[string]string
	fs  string
}

func (f fakeImages) ImageStatus(_ context.Context, r *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	id, ok := f.ids[r.GetImage().GetImage()]
	if !ok {
		return &runtimeapi.ImageStatusResponse{}, nil
	}
	return &runtimeapi.ImageStatusResponse{Image: &runtimeapi.Image{Id: id, RepoDigests: []string{r.GetImage().GetImage()}, Pinned: true}}, nil
}

func (f fakeImages) ListImages(context.Context, *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	var out []*runtimeapi.Image
	for ref, id := range f.ids {
		out = append(out, &runtimeapi.Image{Id: id, RepoDigests: []string{ref}, Pinned: true})
	}
	return &runtimeapi.ListImagesResponse{Images: out}, nil
}

func (f fakeImages) ImageFsInfo(context.Context, *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	return &runtimeapi.ImageFsInfoResponse{ImageFilesystems: []*runtimeapi.FilesystemUsage{
		{FsId: &runtimeapi.FilesystemIdentifier{Mountpoint: f.fs}, UsedBytes: &runtimeapi.UInt64Value{Value: 1}}}}, nil
}

// --registry-gone on a node where every image is present and pinned and pods start from
// them: it exits 0 only when the aggregator counts two holders of every blob of the set's
// images. With a layer held by w1 alone it exits 1, naming the blob, its image, size and
// holder, and that a node replacing w1 would fail; without an aggregator in the config,
// the count cannot be had: exit 1, never ready.
func TestCheckRegistryGoneCountsTheHoldersOfEveryBlob(t *testing.T) {
	const app = "reg.example/shop/app@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	dir := t.TempDir()
	sockDir, err := os.MkdirTemp("", "cri")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	sock := filepath.Join(sockDir, "cri.sock")
	cl, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	cri := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(cri, fakeRuntime{})
	runtimeapi.RegisterImageServiceServer(cri, fakeImages{ids: map[string]string{app: "id-app"}, fs: dir})
	go cri.Serve(cl)
	defer cri.Stop()

	// The aggregator, past its first two heartbeats, with w1 and w2's reports.
	kubeletCA, err := testcerts.NewCA(dir, "kubelet-client-ca")
	if err != nil {
		t.Fatal(err)
	}
	serverCA, err := testcerts.NewCA(dir, "aggregator-ca")
	if err != nil {
		t.Fatal(err)
	}
	srvCert, srvKey, err := serverCA.Server(dir, "aggregator")
	if err != nil {
		t.Fatal(err)
	}
	nodeCert, err := kubeletCA.Node(dir, "w3")
	if err != nil {
		t.Fatal(err)
	}
	tlsConfig, err := aggregator.ServerTLS(srvCert, srvKey, kubeletCA.File)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Now()
	store := aggregator.NewStore(aggregator.DefaultLimits(), func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	seq := uint64(0)
	holds := func(node, held string) {
		t.Helper()
		seq++
		blobs := []status.Blob{{Digest: "sha256:" + strings.Repeat("1", 64), Size: 1 << 10, Held: strings.Contains(held, "1")},
			{Digest: "sha256:" + strings.Repeat("2", 64), Size: 3 << 20, Held: strings.Contains(held, "2")}}
		n := status.Node{Node: status.NodeInfo{Name: node, Peers: &status.PeerBytes{Address: node + ":7444"}}, Sets: []status.Set{{Name: "app", Phase: status.Ready}},
			Blobs: []status.ImageBlobs{{Image: app, Sets: []string{"app"}, Blobs: blobs}}}
		if _, err := store.Ingest(node, v1.FromStatus(n, "boot", seq, time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	holds("w1", "12")
	holds("w2", "1")
	mu.Lock()
	now = now.Add(aggregator.HoldersWarmup)
	mu.Unlock()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := logrus.New()
	log.SetOutput(io.Discard)
	go aggregator.ServeGRPC(ctx, l, tlsConfig, store, log)

	kubeletConfig := write(t, dir, "kubelet.conf", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfeatureGates: {KubeletEnsureSecretPulledImages: true}\n")
	config := func(name, report string) string {
		return write(t, dir, name, fmt.Sprintf("[node]\nname = \"w3\"\nlabels_file = \"\"\n[cri]\nendpoint = \"unix://%s\"\npull_secret = \"\"\n"+
			"[disk]\nkubelet_config = %q\nregistries_conf = %q\nregistries_conf_dir = %q\ncerts_dir = %q\n[kubelet]\nconfig_dir = \"\"\nroot_dir = %q\nbinary = \"\"\n%s",
			sock, kubeletConfig, filepath.Join(dir, "none.conf"), filepath.Join(dir, "none.d"), filepath.Join(dir, "certs.d"), t.TempDir(), report))
	}
	withAggregator := config("c.toml", fmt.Sprintf("[report]\naggregator = %q\ncert = %q\nca = %q\nserver_name = \"localhost\"\n", l.Addr().String(), nodeCert, serverCA.File))
	set := write(t, dir, "app.yaml", "apiVersion: imagepin.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: app}\nspec:\n  nodeSelector: {}\n  pinnedImages:\n  - "+app+"\n")

	code, out, errOut := ctl(t, "check", "--registry-gone", "--config", withAggregator, set)
	short := "1 of the 2 blobs of the images are held by fewer than 2 nodes (with the registry gone, a node joining or replacing one gets every blob from its peers): sha256:" +
		strings.Repeat("2", 64) + " (3.0 MiB, of " + app + ") is held by w1 only: a node replacing w1 would fail, and any node joining once w1 is gone"
	// Apart: this node's own pods start; a node joining would need the registry.
	if code != 1 || !strings.Contains(out, "set app: ADMITTED — 0 of 1 images missing") || !strings.Contains(out, "  registry gone: NOT READY (BlobsNotHeld)\n      "+short+"\n"+
		"    on this node: pods start without the registry\n    for a node joining or replacing one: would need the registry (BlobsNotHeld): 1 blobs held by fewer than 2 nodes\n") {
		t.Fatalf("a layer held by w1 alone: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, _ = ctl(t, "check", "--registry-gone", "--config", withAggregator, "-o", "json", set)
	var report checkReport
	if err := json.Unmarshal([]byte(out), &report); err != nil || code != 1 || len(report.Sets) != 1 {
		t.Fatalf("json: exit %d, %v\n%s", code, err, out)
	}
	if rg := report.Sets[0].RegistryGone; rg.Reason != status.ReasonBlobsNotHeld || rg.BlobHolders.ShortCount != 1 ||
		rg.BlobHolders.Short[0].Holders[0] != "w1" || rg.BlobHolders.Short[0].Size != 3<<20 || rg.BlobHolders.Short[0].Pinners != 2 ||
		rg.Node.Status != status.True || rg.Node.Reason != status.ReasonImagesHeld || len(rg.Node.Why) != 0 {
		t.Fatalf("json: %+v", rg)
	}

	holds("w2", "12")
	mu.Lock()
	now = now.Add(aggregator.HoldersFreshness) // the count is made again
	mu.Unlock()
	code, out, errOut = ctl(t, "check", "--registry-gone", "--config", withAggregator, set)
	if code != 0 || !strings.Contains(out, "registry gone: ready: 1 images present and pinned; ") ||
		!strings.Contains(out, "; each of the 2 blobs of the images held by at least 2 nodes\n") {
		t.Fatalf("every blob held twice: exit %d\n%s\n%s", code, out, errOut)
	}

	code, out, errOut = ctl(t, "check", "--registry-gone", "--config", config("alone.toml", ""), set)
	if code != 1 || !strings.Contains(out, "registry gone: NOT READY (cannot be told: BlobHoldersUnknown)\n      whether every blob of the images is held by 2 nodes cannot be told: no aggregator to count them ([report] aggregator is not set in the config)\n"+
		"    on this node: pods start without the registry\n    for a node joining or replacing one: cannot be told (BlobHoldersUnknown)\n") {
		t.Fatalf("no aggregator: exit %d\n%s\n%s", code, out, errOut)
	}
	// Without --registry-gone the answer is given, and the exit is the disk check's.
	if code, out, _ = ctl(t, "check", "--config", config("alone2.toml", ""), set); code != 0 || !strings.Contains(out, "NOT READY") {
		t.Fatalf("without --registry-gone: exit %d\n%s", code, out)
	}
}
