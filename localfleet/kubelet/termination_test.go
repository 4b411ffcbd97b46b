package kubelet

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// A failed container under FallbackToLogsOnError reports its log's tail, as
// a kubelet does: the last 80 lines, at most their last 2 KiB. Under the
// File policy, or on success, it reports nothing.
func TestTerminationMessageIsTheFailedContainersLogTail(t *testing.T) {
	lines := func(from, to int) string {
		var b strings.Builder
		for i := from; i <= to; i++ {
			fmt.Fprintf(&b, "line %d\n", i)
		}
		return b.String()
	}
	long := strings.Repeat("x", 100) + "\n"
	fallback, file := corev1.TerminationMessageFallbackToLogsOnError, corev1.TerminationMessageReadFile
	for _, tc := range []struct {
		name   string
		policy corev1.TerminationMessagePolicy
		code   int32
		log    string
		want   string
	}{
		{"a short log whole", fallback, 1, "starting\nno pool named p\n", "starting\nno pool named p\n"},
		{"the last 80 of 100 lines", fallback, 1, lines(1, 100), lines(21, 100)},
		{"the last 80 lines without a final newline", fallback, 2, lines(1, 100) + "panic", lines(22, 100) + "panic"},
		{"at most 2 KiB of long lines", fallback, 1, strings.Repeat(long, 30), strings.Repeat(long, 30)[30*101-2048:]},
		{"an empty log", fallback, 1, "", ""},
		{"nothing on success", fallback, 0, "done\n", ""},
		{"nothing under the File policy", file, 1, "no pool named p\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "epp.log")
			if err := os.WriteFile(path, []byte(tc.log), 0o644); err != nil {
				t.Fatal(err)
			}
			got := terminationMessage(&corev1.Container{TerminationMessagePolicy: tc.policy}, tc.code, path)
			if got != tc.want {
				t.Errorf("message %q, want %q", got, tc.want)
			}
		})
	}
	t.Run("a log that cannot be read is named", func(t *testing.T) {
		got := terminationMessage(&corev1.Container{TerminationMessagePolicy: fallback}, 1, filepath.Join(t.TempDir(), "missing.log"))
		if !strings.HasPrefix(got, "Error on reading termination message from logs:") {
			t.Errorf("message %q", got)
		}
	})
}
