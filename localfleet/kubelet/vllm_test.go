package kubelet

import (
	"slices"
	"testing"
)

// The vLLM command lines users and presets write become simulator flags:
// GPU-only flags dropped, the model, names, port and limits kept.
func TestVLLMCommandLinesBecomeSimulatorFlags(t *testing.T) {
	preset := "exec vllm serve /mnt/models --served-model-name \"m\" \"publishers/ns/models/m\" --port 8000 --disable-uvicorn-access-log --tensor-parallel-size 2 ${VLLM_ADDITIONAL_ARGS} \"$@\""
	cases := []struct {
		name          string
		command, args []string
		env           map[string]string
		want          []string
		port, dp      int
	}{
		{"image entrypoint", nil, []string{"facebook/opt-125m", "--served-model-name", "opt", "--port", "8001", "--max-model-len=4096", "--enforce-eager"}, nil,
			[]string{"--model", "facebook/opt-125m", "--served-model-name", "opt", "--max-model-len", "4096", "--enforce-eager"}, 8001, 1},
		{"vllm serve command", []string{"vllm", "serve"}, []string{"org/model", "--max-num-seqs", "4", "--trust-remote-code"}, nil,
			[]string{"--model", "org/model", "--max-num-seqs", "4", "--max-model-len", "32768"}, 8000, 1},
		{"api server module", []string{"python3", "-m", "vllm.entrypoints.openai.api_server"}, []string{"--model", "x/y", "--data-parallel-size", "2"}, nil,
			[]string{"--model", "x/y", "--max-model-len", "32768"}, 8000, 2},
		{"preset script with user args and env", []string{"/bin/bash", "-c", preset, "--"}, []string{"--max-num-seqs", "3"}, map[string]string{"VLLM_ADDITIONAL_ARGS": "--seed 7"},
			[]string{"--model", "/mnt/models", "--served-model-name", "m", "publishers/ns/models/m", "--seed", "7", "--max-num-seqs", "3", "--max-model-len", "32768"}, 8000, 1},
		{"lora modules", nil, []string{"m", "--enable-lora", "--lora-modules", "a=/mnt/lora/a", "b=/mnt/lora/b"}, nil,
			[]string{"--model", "m", "--lora-modules", `{"name":"a","path":"/mnt/lora/a"}`, `{"name":"b","path":"/mnt/lora/b"}`, "--max-model-len", "32768"}, 8000, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, port, dp, err := translateVLLM(vllmArgs(c.command, c.args, c.env))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) || port != c.port || dp != c.dp {
				t.Errorf("got %q port %d dp %d\nwant %q port %d dp %d", got, port, dp, c.want, c.port, c.dp)
			}
		})
	}
}

func TestInvalidVLLMPortIsRefused(t *testing.T) {
	if _, _, _, err := translateVLLM([]string{"m", "--port", "http"}); err == nil {
		t.Fatal("non-numeric port accepted")
	}
}
