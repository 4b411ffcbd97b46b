// Package host describes the machine a benchmark ran on: results from a
// shared, noisy machine mean little without it.
package host

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Machine is "<cpus> × <model name>" from /proc/cpuinfo, "" elsewhere.
func Machine() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	model, cpus := "", 0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "model name") {
			cpus++
			model = strings.TrimSpace(line[strings.IndexByte(line, ':')+1:])
		}
	}
	return fmt.Sprintf("%d × %s", cpus, model)
}

// LoadAverage is the 1-minute load average, 0 when unknown.
func LoadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return f
}
