package kubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
)

// SimulatorRuntime runs vLLM-compatible model-server containers as
// llm-d-inference-sim, translating the vLLM command line: the flags the
// simulator shares with vLLM are kept, the ones that only matter on a GPU are
// dropped, and the port is remapped so that podIP:port reaches it.
type SimulatorRuntime struct {
	// Binary is the llm-d-inference-sim executable.
	Binary string
	// Repos are image repository fragments served by this runtime.
	Repos []string
	// DefaultArgs are added before the container's own flags, e.g. a latency
	// model for the cluster's GPUs. Container env FLEETINFER_SIM_ARGS is
	// added after them.
	DefaultArgs []string
}

// SimArgsEnv names the container environment variable whose value (split on
// spaces) is appended to the simulator's flags.
const SimArgsEnv = "FLEETINFER_SIM_ARGS"

// DefaultModelServerImages are the image families treated as vLLM.
var DefaultModelServerImages = []string{"vllm", "llm-d-cuda", "llm-d-rocm", "llm-d-xpu", "llm-d-inference-sim"}

func (r SimulatorRuntime) Name() string {
	return "vLLM-compatible images (" + strings.Join(r.Repos, ", ") + ") as llm-d-inference-sim"
}

func (r SimulatorRuntime) Matches(image string) bool { return matchesAny(image, r.Repos) }

// simFlags are the vLLM flags llm-d-inference-sim understands, with whether
// each takes a value. Everything else vLLM accepts is dropped.
var simFlags = map[string]bool{
	"model": true, "served-model-name": true, "port": true,
	"max-num-seqs": true, "max-model-len": true, "max-loras": true, "max-cpu-loras": true,
	"lora-modules": true, "seed": true, "block-size": true,
	"data-parallel-size": true, "data-parallel-rank": true,
	"ssl-certfile": true, "ssl-keyfile": true,
	"enable-prefix-caching": false, "no-enable-prefix-caching": false,
	"enforce-eager": false, "enable-sleep-mode": false,
}

// vllmBoolFlags are vLLM switches that never take a value; knowing them keeps
// a following positional argument from being read as their value.
var vllmBoolFlags = map[string]bool{
	"enable-lora": true, "enable-prefix-caching": true, "no-enable-prefix-caching": true,
	"enforce-eager": true, "trust-remote-code": true, "disable-log-requests": true,
	"disable-log-stats": true, "enable-expert-parallel": true, "headless": true,
	"enable-sleep-mode": true, "enable-chunked-prefill": true, "no-enable-chunked-prefill": true,
	"enable-auto-tool-choice": true, "disable-uvicorn-access-log": true, "enable-log-requests": true,
	"disable-frontend-multiprocessing": true, "enable-ssl-refresh": true,
}

const defaultVLLMPort = 8000

// Prepare builds the simulator command line from the container's vLLM one.
func (r SimulatorRuntime) Prepare(_ context.Context, c *Container) (*Launch, error) {
	tokens := vllmArgs(c.Command, c.Args, envMap(c.Env))
	if slices.Contains(tokens, "--headless") {
		// A headless vLLM is a worker of a multi-node group (data-parallel
		// ranks of a LeaderWorkerSet): it serves no API, only engine ranks
		// on its node's GPUs that take work from the leader's API server.
		// Neither GPUs nor ranks exist here, so the worker is faked as a
		// process that stays up for as long as the pod runs; the leader's
		// simulator serves the whole group.
		return &Launch{Path: "sleep", Args: []string{"infinity"}, Env: c.Env}, nil
	}
	args, port, dp, err := translateVLLM(tokens)
	if err != nil {
		return nil, err
	}
	local, err := c.FreePort()
	if err != nil {
		return nil, err
	}
	ports := map[int32]int{int32(port): local}
	// With data parallelism the simulator serves one rank per port, counting
	// up from --port, as vLLM's API servers do. Ranks beyond the first need
	// their own consecutive local ports, which cannot be reserved together, so
	// only the first rank is served.
	if dp > 1 {
		args = append(args, "--data-parallel-size=1")
	}
	full := append([]string{"--force-dummy-tokenizer"}, r.DefaultArgs...)
	full = append(full, args...)
	for _, e := range c.Env {
		if v, ok := strings.CutPrefix(e, SimArgsEnv+"="); ok {
			full = append(full, strings.Fields(v)...)
		}
	}
	full = append(full, "--port="+strconv.Itoa(local))
	env := append([]string{}, c.Env...)
	env = append(env, "POD_NAME="+c.Pod.Name, "POD_NAMESPACE="+c.Pod.Namespace, "POD_IP="+c.PodIP)
	return &Launch{Path: r.Binary, Args: full, Env: env, Ports: ports}, nil
}

// vllmArgs finds the vLLM server arguments in a container's command line:
// after "vllm serve", after the OpenAI api_server module, inside a
// "bash -c" script, or, when the image's own entrypoint is used, all args.
// In a script, $VAR and ${VAR} take the container's environment and "$@"
// the words after the script and its $0, as bash would give them.
func vllmArgs(command, args []string, env map[string]string) []string {
	tokens := append(append([]string{}, command...), args...)
	if len(tokens) >= 3 && isShell(tokens[0]) && tokens[1] == "-c" {
		var positional []string
		if len(tokens) > 4 {
			positional = tokens[4:]
		}
		var words []string
		for _, w := range shellWords(extractVLLMLine(tokens[2])) {
			if w == "$@" {
				words = append(words, positional...)
				continue
			}
			// An unset variable expands to nothing, and an unquoted
			// expansion splits into words.
			words = append(words, strings.Fields(os.Expand(w, func(k string) string { return env[k] }))...)
		}
		tokens = words
	}
	for i, t := range tokens {
		if path.Base(t) == "vllm" && i+1 < len(tokens) && tokens[i+1] == "serve" {
			return tokens[i+2:]
		}
		if strings.HasSuffix(t, "vllm.entrypoints.openai.api_server") {
			return tokens[i+1:]
		}
	}
	if len(command) == 0 {
		return args
	}
	return tokens
}

func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, e := range env {
		if k, v, ok := strings.Cut(e, "="); ok {
			m[k] = v
		}
	}
	return m
}

func isShell(s string) bool {
	b := path.Base(s)
	return b == "sh" || b == "bash"
}

// extractVLLMLine returns the part of a shell script from "vllm serve" to the
// end of that command (a newline or an unquoted ;, && or |).
func extractVLLMLine(script string) string {
	i := strings.Index(script, "vllm serve")
	if i < 0 {
		return script
	}
	rest := strings.ReplaceAll(script[i:], "\\\n", " ")
	if j := strings.IndexAny(rest, "\n;&|"); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// shellWords splits a command line on blanks, honouring single and double
// quotes. Variables are left unexpanded: there is no shell here.
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	for _, ch := range s {
		switch {
		case quote != 0:
			if ch == quote {
				quote = 0
			} else {
				cur.WriteRune(ch)
			}
		case ch == '\'' || ch == '"':
			quote, inWord = ch, true
		case ch == ' ' || ch == '\t' || ch == '\n':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(ch)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// translateVLLM keeps the flags the simulator understands and returns them
// with the served port and data-parallel size.
func translateVLLM(tokens []string) (args []string, port, dp int, err error) {
	port, dp = defaultVLLMPort, 1
	model := ""
	maxLen := false
	for i := 0; i < len(tokens); i++ {
		t := tokens[i]
		if !strings.HasPrefix(t, "--") {
			if model == "" {
				model = t // positional model of "vllm serve <model>"
			}
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(t, "--"), "=")
		name = strings.ReplaceAll(name, "_", "-")
		var values []string
		switch {
		case hasValue:
			values = []string{value}
		case vllmBoolFlags[name]:
		case name == "served-model-name" || name == "lora-modules":
			for i+1 < len(tokens) && !strings.HasPrefix(tokens[i+1], "--") {
				i++
				values = append(values, tokens[i])
			}
		case i+1 < len(tokens) && !strings.HasPrefix(tokens[i+1], "--"):
			i++
			values = []string{tokens[i]}
		}
		takesValue, known := simFlags[name]
		if !known {
			continue
		}
		switch name {
		case "port":
			if port, err = strconv.Atoi(first(values)); err != nil || port <= 0 || port > 65535 {
				return nil, 0, 0, fmt.Errorf("invalid vLLM --port %q", first(values))
			}
			continue
		case "model":
			model = first(values)
			continue
		case "data-parallel-size":
			if dp, err = strconv.Atoi(first(values)); err != nil || dp < 1 {
				return nil, 0, 0, fmt.Errorf("invalid vLLM --data-parallel-size %q", first(values))
			}
			continue
		case "max-model-len":
			maxLen = true
		case "lora-modules":
			if values, err = loraModulesJSON(values); err != nil {
				return nil, 0, 0, err
			}
		}
		if !takesValue {
			args = append(args, "--"+name)
			continue
		}
		if len(values) == 0 {
			return nil, 0, 0, fmt.Errorf("vLLM flag --%s needs a value", name)
		}
		args = append(args, "--"+name)
		args = append(args, values...)
	}
	if model == "" {
		model = "facebook/opt-125m" // vLLM's own default model
	}
	args = append([]string{"--model", model}, args...)
	if !maxLen {
		// The simulator's default context is far below any real model's.
		args = append(args, "--max-model-len", "32768")
	}
	return args, port, dp, nil
}

// loraModulesJSON converts vLLM's name=path adapter syntax to the JSON
// objects the simulator expects; JSON entries pass through.
func loraModulesJSON(mods []string) ([]string, error) {
	out := make([]string, 0, len(mods))
	for _, m := range mods {
		if strings.HasPrefix(strings.TrimSpace(m), "{") {
			out = append(out, m)
			continue
		}
		name, p, ok := strings.Cut(m, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("invalid vLLM --lora-modules entry %q (want name=path or JSON)", m)
		}
		b, err := json.Marshal(map[string]string{"name": name, "path": p})
		if err != nil {
			return nil, err
		}
		out = append(out, string(b))
	}
	return out, nil
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}
