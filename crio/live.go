package crio

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// LiveConfig reads the configuration CRI-O has in effect from its socket (GET /config,
// served over the same unix socket as CRI).
type LiveConfig struct {
	Socket string
	client *http.Client
}

// NewLiveConfig returns a reader for CRI-O's socket.
func NewLiveConfig(socket string) *LiveConfig {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true,
	}
	return &LiveConfig{Socket: socket, client: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// config is CRI-O's live config (its `crio config` TOML), as its info socket serves it.
func (l *LiveConfig) config(ctx context.Context) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://crio/config", nil)
	if err != nil {
		return nil, err
	}
	resp, err := l.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("get CRI-O config: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxConfigFileSize))
	if err != nil {
		return nil, fmt.Errorf("get CRI-O config: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("get CRI-O config: %s", resp.Status)
	}
	return body, nil
}

// PinnedImages returns [crio.image] pinned_images as CRI-O has it now.
func (l *LiveConfig) PinnedImages(ctx context.Context) ([]string, error) {
	body, err := l.config(ctx)
	if err != nil {
		return nil, err
	}
	pins, _, err := decodePins(body)
	if err != nil {
		return nil, fmt.Errorf("parse CRI-O config: %w", err)
	}
	return nonEmpty(pins), nil
}
