// Package process starts and stops the child processes of the local fleet
// (etcd, kube-apiserver, controllers, model-server simulators, EPPs) so that
// none of them can outlive the program that started them.
//
// Three mechanisms back each other up: every child gets SIGKILL from the kernel
// when its parent thread dies (Pdeathsig), which covers os.Exit, log.Fatal and
// panics that skip deferred cleanup; every child leads its own process group so
// Stop reaches anything it forked; and every PID is recorded in a Registry that
// tests use to prove nothing is left running.
package process

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Spec describes a child process.
type Spec struct {
	// Name identifies the process in logs and in the Registry.
	Name string
	Path string
	Args []string
	// Env is appended to a minimal environment (PATH and HOME of the parent).
	Env []string
	Dir string
	// LogPath receives stdout and stderr; empty discards them.
	LogPath string
}

// Process is a running (or exited) child.
type Process struct {
	Spec
	cmd       *exec.Cmd
	startTime string
	done      chan struct{}
	exitErr   error
	logFile   *os.File
}

// launcher starts every child from one goroutine locked to its OS thread for the
// life of the program. Pdeathsig fires when the *thread* that forked the child
// exits, and the Go runtime may retire ordinary threads, so forking from an
// arbitrary goroutine could kill a child early.
var launcher = struct {
	once sync.Once
	reqs chan launchRequest
}{}

type launchRequest struct {
	cmd *exec.Cmd
	err chan error
}

func launch(cmd *exec.Cmd) error {
	launcher.once.Do(func() {
		launcher.reqs = make(chan launchRequest)
		go func() {
			runtime.LockOSThread()
			for r := range launcher.reqs {
				r.err <- r.cmd.Start()
			}
		}()
	})
	errc := make(chan error, 1)
	launcher.reqs <- launchRequest{cmd: cmd, err: errc}
	return <-errc
}

// Start launches spec and records it in reg.
func Start(spec Spec, reg *Registry) (*Process, error) {
	cmd := exec.Command(spec.Path, spec.Args...)
	cmd.Dir = spec.Dir
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, spec.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p := &Process{Spec: spec, cmd: cmd, done: make(chan struct{})}
	if spec.LogPath != "" {
		f, err := os.OpenFile(spec.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("open log for %s: %w", spec.Name, err)
		}
		p.logFile = f
		cmd.Stdout, cmd.Stderr = f, f
	}
	if err := launch(cmd); err != nil {
		p.closeLog()
		return nil, fmt.Errorf("start %s (%s): %w", spec.Name, spec.Path, err)
	}
	p.startTime = StartTime(cmd.Process.Pid)
	if reg != nil {
		reg.add(p)
	}
	go func() {
		p.exitErr = cmd.Wait()
		p.closeLog()
		close(p.done)
	}()
	return p, nil
}

func (p *Process) closeLog() {
	if p.logFile != nil {
		_ = p.logFile.Close()
	}
}

// PID is the child's process ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Done is closed when the child has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitErr is the result of waiting for the child; valid after Done.
func (p *Process) ExitErr() error { return p.exitErr }

// Exited reports whether the child has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM to the child's process group, waits up to grace, then
// sends SIGKILL and waits for the child to be reaped.
func (p *Process) Stop(grace time.Duration) {
	if p.Exited() {
		return
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	p.Kill()
}

// Kill sends SIGKILL to the child's process group and waits for it.
func (p *Process) Kill() {
	_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	<-p.done
}

// Registry records every child started with it.
type Registry struct {
	mu    sync.Mutex
	procs []*Process
}

func (r *Registry) add(p *Process) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.procs = append(r.procs, p)
}

// Started lists every process ever started with this registry.
func (r *Registry) Started() []*Process {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*Process(nil), r.procs...)
}

// StopAll stops every process that is still running, newest first, giving
// each the grace period.
func (r *Registry) StopAll(grace time.Duration) {
	procs := r.Started()
	var wg sync.WaitGroup
	for i := len(procs) - 1; i >= 0; i-- {
		wg.Add(1)
		go func(p *Process) {
			defer wg.Done()
			p.Stop(grace)
		}(procs[i])
	}
	wg.Wait()
}

// Alive returns a description of every recorded process that still exists
// in the process table (including zombies), judged from /proc rather than from
// our own bookkeeping so that a bug in Stop cannot hide a leak. A PID reused by
// an unrelated process is told apart by its start time.
func (r *Registry) Alive() []string {
	var alive []string
	for _, p := range r.Started() {
		if st := StartTime(p.PID()); st != "" && st == p.startTime {
			alive = append(alive, fmt.Sprintf("%s (pid %d)", p.Name, p.PID()))
		}
	}
	return alive
}

// StartTime returns field 22 of /proc/<pid>/stat (start time in clock
// ticks since boot), or "" when the process does not exist.
func StartTime(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// The command name (field 2) is in parentheses and may contain spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is field 3 (state); start time is field 22.
	if len(fields) < 20 {
		return ""
	}
	return fields[19]
}

// ErrExited is returned by waiters when the process exits before the awaited
// condition holds.
var ErrExited = errors.New("process exited")
