package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
	"gopkg.in/yaml.v3"
)

// A config file is YAML: a flat mapping from flag names (without the
// dashes) to values, for any command, e.g.
//
//	remote: s3://bucket/kafka?endpoint=https://s3.example.com
//	ship-after: 10m
//	local-retention-bytes: 50GB
//	metrics-listen: 127.0.0.1:9464
//
// Each command takes the settings it has flags for. Precedence: the
// command line, then TIERFS_* variables, then the file, then defaults.

// configFlag names the file; a global flag, so every command reads it.
// (A new one per app: cli marks flags as set when it applies them.)
func configFlag() cli.Flag {
	return &cli.StringFlag{Name: "config", Usage: "read settings from this YAML file (flag: value); command-line flags and TIERFS_* variables win", EnvVars: []string{"TIERFS_CONFIG"}}
}

// readConfig parses a config file into flag name → value.
func readConfig(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var raw map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&raw); err != nil && !errors.Is(err, io.EOF) { // io.EOF: an empty file
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := map[string]string{}
	for k, v := range raw {
		switch v.(type) {
		case map[string]any, []any:
			return nil, fmt.Errorf("%s: %s: a setting is a single value", path, k)
		case nil:
			return nil, fmt.Errorf("%s: %s has no value", path, k)
		}
		out[k] = fmt.Sprint(v)
	}
	return out, nil
}

// applyConfig sets, for the command of c, every flag the config file
// names that the command line and environment left unset. A setting no
// command knows is an error (a typo would otherwise be silently ignored).
func applyConfig(c *cli.Context) error {
	path := c.String("config")
	if path == "" {
		return nil
	}
	settings, err := readConfig(path)
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("--config: %w", err)}
	}
	known := allFlagNames(c.App)
	var keys []string
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !known[k] {
			return &exitError{code: 2, err: fmt.Errorf("--config %s: no command has a setting %q", path, k)}
		}
		if k == "config" || !hasFlag(c, k) || c.IsSet(k) {
			continue
		}
		if err := c.Set(k, settings[k]); err != nil {
			return &exitError{code: 2, err: fmt.Errorf("--config %s: %s: %q is not a value it takes (%v)", path, k, settings[k], err)}
		}
	}
	return nil
}

// hasFlag says whether c's command, or the app, has flag name.
func hasFlag(c *cli.Context, name string) bool {
	flags := slices.Clone(c.App.Flags)
	if c.Command != nil {
		flags = append(flags, c.Command.Flags...)
	}
	for _, f := range flags {
		if slices.Contains(f.Names(), name) {
			return true
		}
	}
	return false
}

// allFlagNames are the flags of the app and of all its commands.
func allFlagNames(app *cli.App) map[string]bool {
	names := map[string]bool{}
	add := func(flags []cli.Flag) {
		for _, f := range flags {
			for _, n := range f.Names() {
				names[strings.TrimLeft(n, "-")] = true
			}
		}
	}
	add(app.Flags)
	var walk func([]*cli.Command)
	walk = func(cmds []*cli.Command) {
		for _, cmd := range cmds {
			add(cmd.Flags)
			walk(cmd.Subcommands)
		}
	}
	walk(app.Commands)
	return names
}
