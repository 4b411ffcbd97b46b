// Package memlimit sets the Go runtime's soft memory limit from the memory
// limit of the container a process runs in.
//
// Without a soft limit the collector lets the heap grow to twice what was
// live after the last collection, whatever the container allows: a picker
// holding 10,000 slow request streams has about 300 MiB live and would be
// allowed 600 before collecting, and the kernel kills it first. With one
// the collector works harder as the process nears the limit instead.
package memlimit

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// Share is the part of the container's limit the runtime keeps to: the
// rest is memory it does not account for (thread stacks of the OS, the
// binary's text) and room for the collector to act before the kernel does.
const Share = 0.9

// unlimited bounds the limits read as real: cgroup v1 reports none as the
// largest page-aligned int64, above it; cgroup v2 writes "max".
const unlimited = 1 << 62

// Container returns the memory limit of the cgroup mounted at root (v2's
// memory.max, else v1's memory/memory.limit_in_bytes), false when it sets
// none or cannot be read.
func Container(root string) (int64, bool) {
	for _, name := range []string{"memory.max", filepath.Join("memory", "memory.limit_in_bytes")} {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || n <= 0 || n >= unlimited {
			return 0, false
		}
		return n, true
	}
	return 0, false
}

// Apply sets the runtime's soft memory limit to Share of a container limit
// and returns it.
func Apply(limit int64) int64 {
	soft := int64(float64(limit) * Share)
	debug.SetMemoryLimit(soft)
	return soft
}

// FromContainer applies the limit of the process's own cgroup
// (/sys/fs/cgroup) unless GOMEMLIMIT, the operator's own choice, is set.
// It returns the soft limit applied, false when it applied none.
func FromContainer() (int64, bool) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0, false
	}
	limit, ok := Container("/sys/fs/cgroup")
	if !ok {
		return 0, false
	}
	return Apply(limit), true
}
