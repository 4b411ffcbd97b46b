// Package metrics reads Prometheus text endpoints, for tests and benchmarks
// that check what a component reports about itself.
package metrics

import (
	"context"
	"strconv"
	"strings"

	"github.com/fleetinfer/fleetinfer/internal/httpget"
)

// Scrape reads a Prometheus text endpoint into series → value, the series
// written as the endpoint writes it (name{label="value",...}).
func Scrape(ctx context.Context, url string) (map[string]float64, error) {
	b, err := httpget.Body(ctx, url, 32<<20)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, nil
}

// Name is the metric name of a series.
func Name(series string) string {
	name, _, _ := strings.Cut(series, "{")
	return name
}
