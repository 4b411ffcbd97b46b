package gierunner

import (
	"net/http"
	"net/http/pprof"
	"runtime"

	"github.com/spf13/pflag"
)

// fleetinfer: GIE v1.5.0's --enable-pprof (on by default) serves the named
// runtime profiles only, no CPU profile or execution trace, and records
// every blocking and mutex event (rates of 1) for as long as the EPP runs,
// which costs each pick about a tenth more CPU (BenchmarkPick in package
// epp, with and without -blockprofile and -mutexprofile). Here
// --enable-pprof serves net/http/pprof on the metrics port, behind the
// metrics endpoint's authentication, and the contention profiles
// (block and mutex) record only with --contention-profiling, as the
// Kubernetes components' flag of that name does.

// contentionProfilingFlag is the flag that turns the block and mutex
// profiles on.
const contentionProfilingFlag = "contention-profiling"

func addProfilingFlags(fs *pflag.FlagSet, contention *bool) {
	fs.BoolVar(contention, contentionProfilingFlag, false,
		"Record every blocking and mutex event for the block and mutex profiles that --enable-pprof serves (each pick then costs more CPU).")
}

// pprofHandlers are the profiling endpoints by path: the index, which also
// serves every named profile (/debug/pprof/heap, allocs, goroutine, block,
// mutex, threadcreate), the CPU profile, the execution trace, and the
// symbol lookup of `go tool pprof`. Not the command line: it holds the
// EndpointPickerConfig (--config-text) and file paths, and the endpoints
// are open to whoever reaches the metrics port when its authentication is
// off, as in KServe's scheduler preset.
func pprofHandlers() map[string]http.Handler {
	return map[string]http.Handler{
		"/debug/pprof/":        http.HandlerFunc(pprof.Index),
		"/debug/pprof/profile": http.HandlerFunc(pprof.Profile),
		"/debug/pprof/symbol":  http.HandlerFunc(pprof.Symbol),
		"/debug/pprof/trace":   http.HandlerFunc(pprof.Trace),
	}
}

// recordContention sets the block and mutex profiles to record every event
// (on) or none (off).
func recordContention(on bool) {
	rate := 0
	if on {
		rate = 1
	}
	runtime.SetBlockProfileRate(rate)
	runtime.SetMutexProfileFraction(rate)
}
