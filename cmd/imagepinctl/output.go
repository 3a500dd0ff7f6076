package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// Output formats, as kubectl spells them.
const (
	outTable = "table"
	outWide  = "wide"
	outJSON  = "json"
	outYAML  = "yaml"
)

// outputFlag is -o/--output with the formats a command offers; the first is the default.
type outputFlag struct {
	value   string
	allowed []string
}

func addOutputFlag(cmd *cobra.Command, allowed ...string) *outputFlag {
	o := &outputFlag{value: allowed[0], allowed: allowed}
	cmd.Flags().StringVarP(&o.value, "output", "o", allowed[0], "output format: "+strings.Join(allowed, "|"))
	_ = cmd.RegisterFlagCompletionFunc("output", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return allowed, cobra.ShellCompDirectiveNoFileComp
	})
	return o
}

// check is a usage error for a format the command does not offer.
func (o *outputFlag) check() error {
	if o.value == "text" && slices.Contains(o.allowed, outTable) { // the old spelling of check's table
		o.value = outTable
	}
	if !slices.Contains(o.allowed, o.value) {
		return fail(exitUsage, "--output %s: want %s", o.value, strings.Join(o.allowed, ", "))
	}
	return nil
}

func (o *outputFlag) data() bool { return o.value == outJSON || o.value == outYAML }

// writeData prints v as indented JSON or as YAML.
func (o *outputFlag) writeData(w io.Writer, v any) error {
	switch o.value {
	case outJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case outYAML:
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	return fmt.Errorf("output %s is not a data format", o.value)
}
