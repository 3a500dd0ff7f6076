// Command imagepinctl is imagepin's command line: validate set files, resolve tags to
// digests, show a node's or the cluster's status, check disk and reachability, run the
// pin-and-pull flow once against a CRI socket, expand an OpenShift release into sets,
// make a set from what the cluster's pods run, seed the node's blob store from offline
// media, and give every node back before imagepin is removed from a cluster.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/imagepin/imagepin/conf"
)

// version is set at build time.
var version = "0.1.0-dev"

// Exit codes, the same for every command.
const (
	exitOK = 0
	// exitNo: the command's answer is "no" (an invalid file, a set not ready, an image
	// that cannot be resolved).
	exitNo = 1
	// exitUsage: a usage or operational error (bad flag, unreadable config, no answer).
	exitUsage = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// exitError ends a command with a code; its message, if any, is printed on stderr.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

// exit ends the command with code after it printed what it had to say.
func exit(code int) error {
	if code == exitOK {
		return nil
	}
	return &exitError{code: code}
}

// fail ends the command with code and a message ("imagepinctl CMD: ...").
func fail(code int, format string, args ...any) error {
	return &exitError{code: code, err: fmt.Errorf(format, args...)}
}

// run executes one command line and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", cmd.CommandPath(), ee.err)
		}
		return ee.code
	}
	// cobra's own: an unknown command or flag, a missing argument.
	fmt.Fprintf(stderr, "%s: %v\nSee '%s --help'.\n", cmd.CommandPath(), err, cmd.CommandPath())
	return exitUsage
}

// globals are the flags every command has.
type globals struct {
	configPath string
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "imagepinctl",
		Short: "Pin and pre-load container images on Kubernetes and OpenShift nodes",
		Long: `imagepinctl is imagepin's command line. imagepind, the node daemon, pins the images of
every PinnedImageSet that selects its node in CRI-O and pulls them before they are needed;
imagepinctl checks set files, resolves tags to digests, shows what imagepind and the
aggregator report, and runs the same flow once in the foreground.

Exit codes, for every command: 0 yes (valid, ready, admitted), 1 no (an invalid file, a set
not ready, an image that cannot be reached), 2 a usage or operational error.`,
		Version:       version,
		SilenceErrors: true,
		SilenceUsage:  true,
		// Without a command: the help, as a usage error.
		RunE: func(cmd *cobra.Command, _ []string) error {
			cmd.SetOut(cmd.ErrOrStderr())
			_ = cmd.Help()
			return exit(exitUsage)
		},
		Args: cobra.NoArgs,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%w", err) // printed with the command's path by run
	})
	root.PersistentFlags().StringVar(&g.configPath, "config", conf.DefaultConfigPath,
		"imagepind's config file (the CRI socket, state, registries.conf, certs.d, pull secret)")
	_ = root.MarkPersistentFlagFilename("config", "toml")

	root.AddGroup(&cobra.Group{ID: "sets", Title: "Set files:"},
		&cobra.Group{ID: "node", Title: "This node (and the cluster, with status --aggregator):"},
		&cobra.Group{ID: "cluster", Title: "The cluster:"})
	for _, c := range []*cobra.Command{
		newValidate(g), newResolve(g), newRelease(g), newGenerate(g),
		newStatus(g), newCheck(g), newApply(g), newSeed(g),
		newUninstallNodes(), newVersion(),
	} {
		root.AddCommand(c)
	}
	return root
}

func newVersion() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print imagepinctl's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), version)
			return nil
		},
	}
}

// loadConfig reads imagepind's config; the default path may be absent.
func (g *globals) loadConfig(cmd *cobra.Command) (conf.Config, error) {
	return conf.LoadConfig(g.configPath, cmd.Flags().Changed("config"))
}

// files wants at least one FILE argument.
func files(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("no FILE given: usage: %s", cmd.UseLine())
	}
	return nil
}

// setFileArgs completes set files.
func setFileArgs(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return []string{"yaml", "yml", "json"}, cobra.ShellCompDirectiveFilterFileExt
}
