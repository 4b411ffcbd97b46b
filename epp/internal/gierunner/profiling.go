package gierunner

import (
	"net/http"
	"net/http/pprof"
	"net/netip"
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
// EndpointPickerConfig (--config-text) and file paths.
//
// unauthenticated says the metrics port they are served on checks no
// caller (--metrics-endpoint-auth=false, as in KServe's scheduler preset):
// they then answer only callers on the pod's loopback, which is where
// `kubectl port-forward` connects from, so that any pod that reaches the
// port cannot run 30-second CPU profiles and traces of the picker at will.
func pprofHandlers(unauthenticated bool) map[string]http.Handler {
	hs := map[string]http.Handler{
		"/debug/pprof/":        http.HandlerFunc(pprof.Index),
		"/debug/pprof/profile": http.HandlerFunc(pprof.Profile),
		"/debug/pprof/symbol":  http.HandlerFunc(pprof.Symbol),
		"/debug/pprof/trace":   http.HandlerFunc(pprof.Trace),
	}
	if unauthenticated {
		for path, h := range hs {
			hs[path] = loopbackOnly(h)
		}
	}
	return hs
}

// loopbackOnly answers 403 to callers whose address is not a loopback one.
func loopbackOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ap, err := netip.ParseAddrPort(r.RemoteAddr); err != nil || !ap.Addr().Unmap().IsLoopback() {
			http.Error(w, "profiling answers only loopback callers (kubectl port-forward) while --metrics-endpoint-auth is off", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
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
