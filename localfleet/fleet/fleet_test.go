package fleet

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A failed start removes the fleet's directory, so the end of every log the
// error names travels in the error.
func TestFailedStartCarriesTheEndOfTheLogsItNames(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "hub", "logs", "kube-apiserver.log")
	if err := os.MkdirAll(filepath.Dir(log), 0o755); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for i := range 30 {
		lines = append(lines, fmt.Sprintf("line %d", i))
	}
	if err := os.WriteFile(log, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cause := errors.New("hub/kube-apiserver exited before it was ready (exit status 1); see " + log)
	err := withLogTails(cause, dir)
	if !errors.Is(err, cause) {
		t.Fatalf("the cause is lost: %v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "line 29") || !strings.Contains(msg, "line 15") || strings.Contains(msg, "line 14\n") {
		t.Fatalf("want the last 15 lines, got:\n%s", msg)
	}
	other := errors.New("see /elsewhere/x.log")
	if got := withLogTails(other, dir); got != other {
		t.Fatalf("a log outside the fleet's directory was read: %v", got)
	}
}
