package kubelet

import (
	"bytes"
	"fmt"
	"io"
	"os"

	corev1 "k8s.io/api/core/v1"
)

// A kubelet's limits on a termination message taken from a container's log
// (kubecontainer.MaxContainerTerminationMessageLogLines and ...LogLength).
const (
	terminationLogLines = 80
	terminationLogBytes = 2048
)

// terminationMessage is what a kubelet puts in a terminated container's
// status message. Under FallbackToLogsOnError a failed container's message
// is the tail of its log, so `kubectl describe` shows why it exited. The
// File policy reads a file the container wrote at terminationMessagePath;
// the local fleet's processes run on the host, where that path is not the
// container's, so they leave no message, as a container that wrote none.
func terminationMessage(c *corev1.Container, exitCode int32, logPath string) string {
	if exitCode == 0 || c.TerminationMessagePolicy != corev1.TerminationMessageFallbackToLogsOnError {
		return ""
	}
	return logTail(logPath)
}

// logTail returns the last terminationLogLines lines of the file at path,
// at most their last terminationLogBytes bytes.
func logTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("Error on reading termination message from logs: %v", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("Error on reading termination message from logs: %v", err)
	}
	off := max(0, st.Size()-terminationLogBytes)
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && err != io.EOF {
		return fmt.Sprintf("Error on reading termination message from logs: %v", err)
	}
	// A final newline ends the last line rather than starting another.
	body := bytes.TrimSuffix(buf, []byte("\n"))
	for i, n := len(body)-1, 0; i >= 0; i-- {
		if body[i] != '\n' {
			continue
		}
		if n++; n == terminationLogLines {
			return string(buf[i+1:])
		}
	}
	return string(buf)
}
