package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	eventsapi "github.com/containerd/containerd/api/events"
	eventsservice "github.com/containerd/containerd/api/services/events/v1"
	"google.golang.org/protobuf/proto"
)

// ImageEvent is a change of one image record in the namespace.
type ImageEvent struct {
	Name    string
	Deleted bool
	// Pinned says whether the record carries the pinned label after the change.
	Pinned bool
}

// ImageEvents streams the namespace's image events (/images/create, /images/update,
// /images/delete) to fn until ctx ends or the stream breaks (containerd restarting).
func (i *Images) ImageEvents(ctx context.Context, fn func(ImageEvent)) error {
	stream, err := eventsservice.NewEventsClient(i.conn).Subscribe(ctx, &eventsservice.SubscribeRequest{
		Filters: []string{fmt.Sprintf(`namespace==%q,topic~="^/images/"`, i.namespace)},
	})
	if err != nil {
		return convert("subscribe to image events", err)
	}
	for {
		env, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return ctx.Err()
			}
			return convert("image events", err)
		}
		if env.GetNamespace() != i.namespace || env.GetEvent() == nil {
			continue
		}
		value := env.GetEvent().GetValue()
		switch env.GetTopic() {
		case "/images/create":
			var e eventsapi.ImageCreate
			if proto.Unmarshal(value, &e) == nil {
				fn(ImageEvent{Name: e.GetName(), Pinned: e.GetLabels()[PinnedLabel] == PinnedLabelValue})
			}
		case "/images/update":
			var e eventsapi.ImageUpdate
			if proto.Unmarshal(value, &e) == nil {
				fn(ImageEvent{Name: e.GetName(), Pinned: e.GetLabels()[PinnedLabel] == PinnedLabelValue})
			}
		case "/images/delete":
			var e eventsapi.ImageDelete
			if proto.Unmarshal(value, &e) == nil {
				fn(ImageEvent{Name: e.GetName(), Deleted: true})
			}
		}
	}
}

// EventSource is the part of containerd's API the pinner watches.
type EventSource interface {
	ImageEvents(ctx context.Context, fn func(ImageEvent)) error
}

// Watch follows containerd's image events: a wanted image whose record loses the
// pinned label (containerd 2.x's CRI pull replaces a record's labels when it pulls a
// reference again: the kubelet's pull of an image a pod needs unpins it), or whose
// record is deleted, is looked at again by the next Write, and changed asks for that
// pass at once. It resubscribes, with backoff, until ctx ends.
func (p *Pinner) Watch(ctx context.Context, changed func()) error {
	if p.Events == nil {
		return nil
	}
	delay := 250 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := p.Events.ImageEvents(ctx, func(e ImageEvent) {
			p.mu.Lock()
			wanted := p.want[e.Name]
			if wanted && (e.Deleted || !e.Pinned) {
				if p.dirty == nil {
					p.dirty = map[string]bool{}
				}
				p.dirty[e.Name] = true
			}
			p.mu.Unlock()
			if wanted && (e.Deleted || !e.Pinned) {
				changed()
			}
		})
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(start) > time.Minute {
			delay = 250 * time.Millisecond
		}
		// Events missed while the stream was down: look at every wanted image again.
		p.mu.Lock()
		p.resync = true
		p.mu.Unlock()
		changed()
		if err != nil && p.Log != nil {
			p.Log.WithError(err).Debug("containerd image events; resubscribing")
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
	return nil
}
