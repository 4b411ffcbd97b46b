// Package credentials decides which spoke credentials the hub accepts from
// the kubeconfigs stored in its registration Secrets.
//
// Whoever can write a registration Secret must not be able to make the hub
// run a program or read a file on its own host: an exec or auth-provider
// plugin in the kubeconfig runs a command with the hub's privileges, and a
// tokenFile or certificate, key or CA file path makes the hub read that
// file (its own ServiceAccount token, for one) and send it to a server the
// kubeconfig names. Such kubeconfigs are refused unless the hub's operator
// allows them.
package credentials

import (
	"flag"
	"fmt"
	"strings"

	"k8s.io/client-go/rest"
)

// Policy says what a kubeconfig from a Secret may do on the hub's host.
type Policy struct {
	// AllowExec accepts exec and auth-provider plugins.
	AllowExec bool
	// AllowFiles accepts tokenFile and certificate, key and CA file paths.
	AllowFiles bool
}

// Check returns an error naming what cfg, built from a kubeconfig, does on
// the hub's host beyond what the policy allows; nil when nothing.
func (p Policy) Check(cfg *rest.Config) error {
	var found, flags []string
	if !p.AllowExec {
		n := len(found)
		if cfg.ExecProvider != nil {
			found = append(found, fmt.Sprintf("an exec plugin (%s)", cfg.ExecProvider.Command))
		}
		if cfg.AuthProvider != nil {
			found = append(found, fmt.Sprintf("an auth-provider plugin (%s)", cfg.AuthProvider.Name))
		}
		if len(found) > n {
			flags = append(flags, "--"+FlagAllowExec)
		}
	}
	if !p.AllowFiles {
		n := len(found)
		for _, f := range []struct{ what, path string }{
			{"tokenFile", cfg.BearerTokenFile}, {"client-certificate", cfg.CertFile},
			{"client-key", cfg.KeyFile}, {"certificate-authority", cfg.CAFile},
		} {
			if f.path != "" {
				found = append(found, f.what+" "+f.path)
			}
		}
		if len(found) > n {
			flags = append(flags, "--"+FlagAllowFiles)
		}
	}
	if len(found) == 0 {
		return nil
	}
	return fmt.Errorf("the kubeconfig uses %s on the hub's host; embed its credentials as data, or start the hub with %s",
		strings.Join(found, ", "), strings.Join(flags, " and "))
}

// AddFlags adds the hub's flags that set the policy.
func (p *Policy) AddFlags(fs *flag.FlagSet) {
	fs.BoolVar(&p.AllowExec, FlagAllowExec, p.AllowExec, "Accept exec and auth-provider plugins in spoke kubeconfigs from Secrets: commands the hub would run on its host. Off, such a cluster is not engaged.")
	fs.BoolVar(&p.AllowFiles, FlagAllowFiles, p.AllowFiles, "Accept tokenFile and certificate, key and CA file paths in spoke kubeconfigs from Secrets: files the hub would read on its host and send. Off, such a cluster is not engaged.")
}

// The hub's flags that set the policy.
const (
	FlagAllowExec  = "allow-kubeconfig-exec"
	FlagAllowFiles = "allow-kubeconfig-files"
)
