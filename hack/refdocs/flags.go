package main

import (
	"flag"
	"fmt"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/fleetinfer/fleetinfer/epp"
	"github.com/fleetinfer/fleetinfer/internal/cmdflags"
	"github.com/fleetinfer/fleetinfer/internal/kubectlplugin"
)

// command is one binary, or one subcommand, and its flags.
type command struct {
	title, intro string
	flags        []flagDoc
}

type flagDoc struct {
	name, shorthand, typ, def, usage string
}

// commands lists every shipped binary's command line, built by the same
// code the binaries run.
func commands() []command {
	cmds := []command{
		{"hub", "`cmd/hub`: the hub controller.", controllerFlags((&cmdflags.Hub{}).AddFlags)},
		{"spoke", "`cmd/spoke`: the spoke controller, one per GPU cluster.", controllerFlags((&cmdflags.Spoke{}).AddFlags)},
		{"epp", "`cmd/epp`: the endpoint picker, GIE v1.5.0's flags and fleetinfer's.", eppFlags()},
		{"localfleet", "`cmd/localfleet`: runs the local demo (`make demo`).", goFlags((&cmdflags.Demo{}).AddFlags)},
		{"localfleet up", "Starts a local fleet and keeps it running (`make fleet-up`).", goFlags((&cmdflags.Up{}).AddFlags)},
		{"localfleet down", "Stops the local fleet (`make fleet-down`).", goFlags((&cmdflags.Down{}).AddFlags)},
	}
	return append(cmds, cobraCommands(kubectlplugin.NewCommand(genericiooptions.IOStreams{}), "")...)
}

// controllerFlags adds controller-runtime's --kubeconfig, which its
// config package registers on the hub's and spoke's command line at init.
func controllerFlags(add func(*flag.FlagSet)) []flagDoc {
	return goFlags(func(fs *flag.FlagSet) {
		ctrlconfig.RegisterFlags(fs)
		add(fs)
	})
}

func goFlags(add func(*flag.FlagSet)) []flagDoc {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	add(fs)
	var docs []flagDoc
	fs.VisitAll(func(f *flag.Flag) {
		docs = append(docs, flagDoc{name: f.Name, typ: goFlagType(f.Value), def: f.DefValue, usage: f.Usage})
	})
	return docs
}

// goFlagType names a Go flag's type as pflag would: Go's flag package has
// no type name, so it is read from the value (zap's flags have a Type).
func goFlagType(v flag.Value) string {
	if t, ok := v.(interface{ Type() string }); ok {
		return t.Type()
	}
	g, ok := v.(flag.Getter)
	if !ok {
		return "value"
	}
	if _, ok := g.Get().(time.Duration); ok {
		return "duration"
	}
	return reflect.TypeOf(g.Get()).String()
}

// eppFlags are the flags epp.NewRunner puts on pflag's global command line.
// A fresh one is swapped in so that they can be read alone (and again), and
// swapped out after: cobra adds pflag's command line to kubectl-fleetinfer's
// flags.
func eppFlags() []flagDoc {
	defer func(saved *pflag.FlagSet) { pflag.CommandLine = saved }(pflag.CommandLine)
	pflag.CommandLine = pflag.NewFlagSet("fleetinfer-epp", pflag.ContinueOnError)
	epp.NewRunner()
	docs := pflags(pflag.CommandLine)
	for i := range docs {
		// --kubeconfig's default is read from $KUBECONFIG when registered.
		if docs[i].name == "kubeconfig" {
			docs[i].def = "$KUBECONFIG"
		}
	}
	return docs
}

func pflags(fs *pflag.FlagSet) []flagDoc {
	var docs []flagDoc
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden || f.Name == "help" {
			return
		}
		usage := f.Usage
		if f.Deprecated != "" {
			usage = "Deprecated: " + f.Deprecated + " " + usage
		}
		docs = append(docs, flagDoc{name: f.Name, shorthand: f.Shorthand, typ: f.Value.Type(), def: f.DefValue, usage: usage})
	})
	return docs
}

// cobraCommands lists cmd and its subcommands, each with the flags it
// defines; inherited flags are listed once, on the command defining them.
func cobraCommands(cmd *cobra.Command, parent string) []command {
	title := strings.TrimSpace(parent + " " + cmd.Name())
	cmds := []command{{title: title, intro: cmd.Short, flags: pflags(cmd.LocalFlags())}}
	if parent == "" {
		cmds[0].intro = "`cmd/kubectl-fleetinfer`, the kubectl plugin (`kubectl fleetinfer`): " + cmd.Short + ". Its flags apply to every command."
	}
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			cmds = append(cmds, cobraCommands(c, title)...)
		}
	}
	return cmds
}

// stableDefault keeps the page the same on every machine: defaults derived
// from the user's home, the temp directory or the host are named instead.
func stableDefault(def string) string {
	if home, err := os.UserHomeDir(); err == nil && home != "" && home != "/" {
		def = strings.ReplaceAll(def, home, "$HOME")
	}
	if tmp := os.TempDir(); tmp != "/" {
		def = strings.ReplaceAll(def, tmp, "$TMPDIR")
	}
	if host, err := os.Hostname(); err == nil && def == host {
		return "$(hostname)"
	}
	return def
}

func flagsPage() string {
	var b strings.Builder
	b.WriteString(header + "# Command-line flags\n\nEvery flag of every binary fleetinfer ships, sorted by name.\n\n")
	for _, c := range commands() {
		fmt.Fprintf(&b, "## %s\n\n%s\n\n", c.title, c.intro)
		if len(c.flags) == 0 {
			b.WriteString("No flags of its own.\n\n")
			continue
		}
		rows := make([][]string, 0, len(c.flags))
		for _, f := range c.flags {
			name := "--" + f.name
			if f.shorthand != "" {
				name = "-" + f.shorthand + ", " + name
			}
			rows = append(rows, []string{code(name), f.typ, code(stableDefault(f.def)), text(f.usage)})
		}
		table(&b, []string{"Flag", "Type", "Default", "Description"}, rows)
	}
	return b.String()
}
