// Command imagepinctl is imagepin's command line: validate set files, show a node's
// status, and run the pin-and-pull flow once against a CRI socket.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time.
var version = "0.1.0-dev"

const usage = `usage: imagepinctl COMMAND [flags] [args]

commands:
  validate FILE...      check PinnedImageSet files; one "FILE: error" line each; exit 1 if any fails
  status [-o json]      show this node's status (imagepind's status file)
  status --aggregator URL [--watch]
                        the cluster view: per set, nodes ready, failed, unknown, progress, ETA
  apply FILE...         pin and pull the sets once in the foreground against the CRI socket;
                        exit 0 when every set is Ready (refuses while imagepind runs)
  check FILE...         before an upgrade window: can this node hold and reach the sets' images?
                        [--platform os/arch[/variant]] [--labels k=v,...] [-o json]; exit 1 if not
  release PULLSPEC      PinnedImageSet documents (v1) for an OpenShift release, per pool:
                        [--pool worker --pool master] [--os-stream NAME] [--name PREFIX] [-o yaml|json]
  version               print the version

every command takes --config FILE (imagepind's config, default /etc/imagepin/imagepind.toml)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one command and returns the exit code: 0 success, 1 the command's
// answer is "no" (invalid file, set not ready), 2 usage or operational error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "validate":
		return validate(args[1:], stdout, stderr)
	case "status":
		return showStatus(ctx, args[1:], stdout, stderr)
	case "apply":
		return apply(ctx, args[1:], stdout, stderr)
	case "check":
		return check(ctx, args[1:], stdout, stderr)
	case "release":
		return releaseSets(ctx, args[1:], stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, version)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "imagepinctl: unknown command %q\n\n%s", args[0], usage)
	return 2
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}
