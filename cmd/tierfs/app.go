package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// exitError carries a specific exit code.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func exitCode(err error) int {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return 1
}

// Main runs the tierfs command line with args (args[0] is the program name).
func Main(args []string) error { return newApp().Run(args) }

func newApp() *cli.App {
	app := &cli.App{
		Name:    "tierfs",
		Usage:   "a bottomless Kafka log directory: hot segments on local disk, cold ones in object storage",
		Version: version,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error", EnvVars: []string{"TIERFS_LOG_LEVEL"}},
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json", EnvVars: []string{"TIERFS_LOG_FORMAT"}},
			configFlag(),
		},
		Commands: []*cli.Command{
			cmdMount(),
			cmdUmount(),
			cmdIndex(),
			cmdStore(),
			cmdStatus(),
			cmdShip(),
			cmdEvict(),
			cmdHydrate(),
			cmdDoctor(),
			cmdCM(),
			cmdRepl(),
			cmdServe(),
			cmdPull(),
			cmdRole(),
		},
		HideHelpCommand: true,
	}
	for _, cmd := range app.Commands {
		cmd.Before = applyConfig
	}
	return app
}

// newLogger builds the process logger from the global flags.
func newLogger(c *cli.Context) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(c.String("log-format")) {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format must be text or json, not %q", c.String("log-format"))
}
