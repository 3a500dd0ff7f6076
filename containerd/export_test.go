package containerd

// RecordWrites is how many times the record was written.
func (p *Pinner) RecordWrites() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.writes
}
