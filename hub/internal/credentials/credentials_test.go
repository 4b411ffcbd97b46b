package credentials

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

func TestKubeconfigsThatActOnTheHubsHostAreRefusedUnlessAllowed(t *testing.T) {
	const cluster = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443", certificate-authority-data: ""}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`
	// client-go reads the files while it parses the kubeconfig; they must
	// exist. The check refuses the config before any request is sent.
	dir := t.TempDir()
	for _, f := range []string{"token", "hub.crt", "hub.key"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	file := func(s string) string { return strings.ReplaceAll(s, "DIR", dir) }
	tests := []struct {
		name   string
		user   string
		policy Policy
		// want is a part of the refusal; "" accepts.
		want string
	}{
		{name: "an embedded token is accepted", user: `{token: abc}`},
		{name: "embedded certificate data is accepted", user: `{client-certificate-data: "", client-key-data: ""}`},
		{name: "an exec plugin is refused", user: `{exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, id], interactiveMode: Never}}`,
			want: "an exec plugin (/bin/sh) on the hub's host; embed its credentials as data, or start the hub with --allow-kubeconfig-exec"},
		{name: "an exec plugin is accepted when allowed", policy: Policy{AllowExec: true},
			user: `{exec: {apiVersion: client.authentication.k8s.io/v1, command: gke-gcloud-auth-plugin, interactiveMode: Never}}`},
		{name: "an auth-provider plugin is refused", user: `{auth-provider: {name: oidc, config: {idp-issuer-url: "https://127.0.0.1"}}}`,
			want: "an auth-provider plugin (oidc)"},
		{name: "a token file is refused", user: `{tokenFile: DIR/token}`,
			want: "tokenFile DIR/token on the hub's host; embed its credentials as data, or start the hub with --allow-kubeconfig-files"},
		{name: "certificate files are refused", user: `{client-certificate: DIR/hub.crt, client-key: DIR/hub.key}`,
			want: "client-certificate DIR/hub.crt, client-key DIR/hub.key"},
		{name: "a token file is accepted when files are allowed", policy: Policy{AllowFiles: true}, user: `{tokenFile: DIR/token}`},
		{name: "files allowed do not allow exec", policy: Policy{AllowFiles: true},
			user: `{tokenFile: DIR/token, exec: {apiVersion: client.authentication.k8s.io/v1, command: x, interactiveMode: Never}}`,
			want: "an exec plugin (x) on the hub's host; embed its credentials as data, or start the hub with --allow-kubeconfig-exec"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(cluster + "users: [{name: u, user: " + file(tt.user) + "}]\n"))
			if err != nil {
				t.Fatal(err)
			}
			err = tt.policy.Check(cfg)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), file(tt.want))):
				t.Errorf("got %v, want a refusal containing %q", err, file(tt.want))
			}
		})
	}
}
