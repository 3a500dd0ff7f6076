package agent

// The order of pulls by layer. CRI-O (containers/image) fetches a layer once for each
// pull that needs it at the same time, and reuses it once one image holding it is in
// its storage. So while a pull fetches a layer the runtime does not hold yet, no other
// pull that needs it starts: it starts when that pull ends, the layer then held (the
// pull succeeded) or free for the next image to take (it failed). Images with disjoint
// layers pull in parallel up to the width. The layers are the disk check's (the
// manifests it read); an image it did not name layers for is never held back.
// Config.OrderByLayers turns the order on (the composition root decides: CRI-O without
// the node-local mirror).

// layerPull is a layer being fetched: the image whose pull fetches it, and where the
// dispatch scan found the first image waiting for it.
type layerPull struct {
	image  string
	waiter int // scan position of the first image waiting for the layer; -1: none
}

// wait records that the image at scan position pos waits for the layer.
func (p *layerPull) wait(pos int) {
	if p.waiter < 0 || pos < p.waiter {
		p.waiter = pos
	}
}

// blockedBy is a layer of layers, not held, that another pull is fetching (nil: none).
func (p *pullState) blockedBy(layers []string) *layerPull {
	for _, l := range layers {
		if p.held[l] > 0 {
			continue
		}
		if f := p.fetching[l]; f != nil {
			return f
		}
	}
	return nil
}

// claim records that img's pull, starting now, fetches every layer of layers not held.
func (p *pullState) claim(img *imageState, ref string, layers []string) {
	img.layers = layers
	for _, l := range layers {
		if p.held[l] > 0 || p.fetching[l] != nil { // held, or listed twice in the image
			continue
		}
		if p.fetching == nil {
			p.fetching = map[string]*layerPull{}
		}
		p.fetching[l] = &layerPull{image: ref, waiter: -1}
		img.claimed = append(img.claimed, l)
	}
}

// release ends img's pull: its layers are held when it was pulled, and free for the next
// image otherwise. The scan goes back to the first image that waited for one of them.
func (p *pullState) release(img *imageState, pulled bool) {
	for _, l := range img.claimed {
		if f := p.fetching[l]; f != nil {
			if f.waiter >= 0 {
				p.dispatchFrom = min(p.dispatchFrom, f.waiter)
			}
			delete(p.fetching, l)
		}
	}
	img.claimed = nil
	if pulled && !img.holds && len(img.layers) > 0 {
		if p.held == nil {
			p.held = map[string]int{}
		}
		for _, l := range img.layers {
			p.held[l]++
		}
		img.holds = true
	}
}

// unhold forgets that img holds its layers: it is gone from the runtime, or no longer
// wanted (held stays bounded by the wanted images).
func (p *pullState) unhold(img *imageState) {
	if !img.holds {
		return
	}
	for _, l := range img.layers {
		if p.held[l]--; p.held[l] <= 0 {
			delete(p.held, l)
		}
	}
	img.holds = false
}
