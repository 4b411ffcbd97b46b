package memlimit

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

func TestContainerReadsTheCgroupsLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  int64
		ok    bool
	}{
		{name: "cgroup v2 with a limit", files: map[string]string{"memory.max": "536870912\n"}, want: 512 << 20, ok: true},
		{name: "cgroup v2 without a limit", files: map[string]string{"memory.max": "max\n"}},
		{name: "cgroup v1 with a limit", files: map[string]string{"memory/memory.limit_in_bytes": "268435456\n"}, want: 256 << 20, ok: true},
		{name: "cgroup v1 without a limit", files: map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}},
		{name: "v2 is read before v1", files: map[string]string{"memory.max": "1073741824", "memory/memory.limit_in_bytes": "268435456"}, want: 1 << 30, ok: true},
		{name: "no cgroup files"},
		{name: "a file that is not a number", files: map[string]string{"memory.max": "lots\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for name, content := range tc.files {
				path := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, ok := Container(root)
			if got != tc.want || ok != tc.ok {
				t.Errorf("Container = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestApplySetsTheSoftLimitToAShareOfTheContainers(t *testing.T) {
	t.Cleanup(func() { debug.SetMemoryLimit(math.MaxInt64) })
	soft := Apply(512 << 20)
	if want := int64(483183820); soft != want { // 90% of 512 MiB
		t.Errorf("soft limit %d, want %d", soft, want)
	}
	if got := debug.SetMemoryLimit(-1); got != soft {
		t.Errorf("the runtime's limit is %d, want %d", got, soft)
	}
}

func TestFromContainerLeavesAnOperatorsGOMEMLIMIT(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "100MiB")
	before := debug.SetMemoryLimit(-1)
	if _, ok := FromContainer(); ok {
		t.Error("applied a limit over GOMEMLIMIT")
	}
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Errorf("the runtime's limit changed from %d to %d", before, got)
	}
}
