// Package httpget reads a small HTTP resource, such as a Prometheus text
// endpoint, whole.
package httpget

import (
	"context"
	"fmt"
	"io"
	"net/http"
)

// Body GETs url and returns at most limit bytes of its body; a status other
// than 200 is an error.
func Body(ctx context.Context, url string, limit int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, limit))
}
