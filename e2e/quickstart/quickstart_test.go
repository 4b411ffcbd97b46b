// Package quickstart runs the quickstart page (docs/getting-started/quickstart.md)
// exactly as written: the fenced shell blocks between its quickstart markers. It starts its own
// fleet (through `make fleet-up`), so it is a package of its own, apart
// from the fleet the e2e package shares.
package quickstart

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetinfer/fleetinfer/localfleet/binaries"
	"github.com/fleetinfer/fleetinfer/localfleet/up"
)

// Budgets on a loaded 2-core machine: the fleet took 138 s to start with
// other jobs running; the service is Ready within seconds of the placement.
const (
	upTimeout    = 8 * time.Minute
	stepsTimeout = 6 * time.Minute
	downTimeout  = 2 * time.Minute
)

// quickstartPage is the page that holds the quickstart, relative to the
// repository root.
const quickstartPage = "docs/getting-started/quickstart.md"

// quickstartBlocks returns the fenced sh blocks between the page's
// quickstart markers, in order.
func quickstartBlocks(page string) ([]string, error) {
	begin, end := strings.Index(page, "<!-- quickstart:begin -->"), strings.Index(page, "<!-- quickstart:end -->")
	if begin < 0 || end < begin {
		return nil, errors.New("no quickstart markers in " + quickstartPage)
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(page[begin:end], -1) {
		blocks = append(blocks, m[1])
	}
	return blocks, nil
}

func TestQuickstartBlocksAreFound(t *testing.T) {
	got, err := quickstartBlocks("x <!-- quickstart:begin -->\n```sh\na\n```\ntext\n```sh\nb\nc\n```\n<!-- quickstart:end --> ```sh\nd\n```")
	if err != nil || len(got) != 2 || got[0] != "a\n" || got[1] != "b\nc\n" {
		t.Fatalf("blocks %q, %v", got, err)
	}
}

// The quickstart works exactly as written: `make fleet-up` in one
// shell until it prints that the fleet is up; then the kubectl steps in
// another (they fail on the first failing command: the sample and the
// placement applied to the hub, the service Ready, a completion through a
// gateway, the plugin's commands); then `make fleet-down`, after which the
// first shell's command ends and every process of the fleet has exited.
func TestQuickstartWorksAsWritten(t *testing.T) {
	root, err := binaries.Root()
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(root, quickstartPage))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := quickstartBlocks(string(page))
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 3 {
		t.Fatalf("the quickstart has %d shell blocks, want 3 (fleet up, kubectl steps, fleet down)", len(blocks))
	}
	if pid, running := up.Running(filepath.Join(root, ".fleet")); running {
		t.Fatalf("a fleet is already running in .fleet (pid %d): the quickstart would refuse to start", pid)
	}

	// Shell 1: the fleet, in its own process group so that a failed test
	// can stop all of it.
	fleetUp := shell(root, blocks[0])
	fleetUp.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := fleetUp.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	fleetUp.Stderr = fleetUp.Stdout
	began := time.Now()
	if err := fleetUp.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	var upOut lockedBuffer
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		once := sync.Once{}
		for sc.Scan() {
			upOut.WriteLine(sc.Text())
			if strings.HasPrefix(sc.Text(), up.ReadyLine) {
				once.Do(func() { close(ready) })
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		exited <- fleetUp.Wait()
	}()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = syscall.Kill(-fleetUp.Process.Pid, syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(downTimeout):
				_ = syscall.Kill(-fleetUp.Process.Pid, syscall.SIGKILL)
			}
		}
	})
	select {
	case <-ready:
		t.Logf("%s after %s", up.ReadyLine, time.Since(began).Round(time.Second))
	case err := <-exited:
		t.Fatalf("`%s` ended before the fleet was up (%v):\n%s", strings.TrimSpace(blocks[0]), err, upOut.String())
	case <-time.After(upTimeout):
		t.Fatalf("the fleet was not up within %s:\n%s", upTimeout, upOut.String())
	}

	// Shell 2: the kubectl steps.
	stepsBegan := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), stepsTimeout)
	defer cancel()
	steps := shellContext(ctx, root, "set -euo pipefail\n"+blocks[1])
	out, err := steps.CombinedOutput()
	if err != nil {
		t.Fatalf("the quickstart's kubectl steps failed (%v) after %s:\n%s\nfleet:\n%s", err, time.Since(stepsBegan).Round(time.Second), out, upOut.String())
	}
	t.Logf("kubectl steps took %s:\n%s", time.Since(stepsBegan).Round(time.Second), out)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^central\s+True\s+NVIDIA-L40S`),                                                                     // memberclusters
		regexp.MustCompile(`(?m)^qwen2-7b-instruct-nvidia\s+http://\S+\s+True\s+3\s+3\s`),                                           // llmisvc: URL READY (no REASON) CLUSTERS READY CLUSTERS
		regexp.MustCompile(`"choices":\[\{`),                                                                                        // the completion
		regexp.MustCompile(`(?m)^demo\s+qwen2-7b-instruct-nvidia\s+True\s+central 1/1 Running, east 3/3 Running, west 2/2 Running`), // status
		regexp.MustCompile(`(?m)^east\s+chosen\s+3/3 Running\s+room for`),                                                           // explain
		regexp.MustCompile(`(?m)^demo/qwen2-7b-instruct-nvidia\s+\S+\s+1\s+100%`),                                                   // traffic: the one completion
	} {
		if !want.Match(out) {
			t.Errorf("the steps' output does not match %s", want)
		}
	}

	// Shell 2 again: the fleet down.
	down := shell(root, blocks[2])
	if out, err := down.CombinedOutput(); err != nil {
		t.Fatalf("`%s`: %v\n%s", strings.TrimSpace(blocks[2]), err, out)
	}
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Fatalf("`%s` exited with %v:\n%s", strings.TrimSpace(blocks[0]), err, upOut.String())
		}
	case <-time.After(downTimeout):
		t.Fatalf("`%s` still running %s after `%s`", strings.TrimSpace(blocks[0]), downTimeout, strings.TrimSpace(blocks[2]))
	}
	if !strings.Contains(upOut.String(), "Stopped: all ") {
		t.Fatalf("the fleet did not report every process stopped:\n%s", upOut.String())
	}
	if _, err := os.Stat(filepath.Join(root, ".fleet", up.KubeconfigFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the kubeconfig of a stopped fleet is still there (%v)", err)
	}
}

func shell(dir, script string) *exec.Cmd {
	return shellContext(context.Background(), dir, script)
}

func shellContext(ctx context.Context, dir, script string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = dir
	return cmd
}

// lockedBuffer collects lines written by one goroutine and read by another.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) WriteLine(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintln(&l.b, s)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
