package main

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// runApp runs the CLI with args and returns what it printed.
func runApp(t *testing.T, args ...string) (string, error) {
	t.Helper()
	app := newApp()
	var out bytes.Buffer
	app.Writer, app.ErrWriter = &out, &out
	err := app.Run(append([]string{"tierfs"}, args...))
	return out.String(), err
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tierfs.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConfigPrecedence: a setting comes from the command line, else the
// environment, else the config file; settings of other commands are left
// to them.
func TestConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	fileStore, envStore, flagStore := "file://"+filepath.Join(dir, "from-file"), "file://"+filepath.Join(dir, "from-env"), "file://"+filepath.Join(dir, "from-flag")
	cfg := writeConfig(t, "remote: "+fileStore+"\nship-after: 10m\nlocal-retention-bytes: 50000000000\n")
	out, _ := runApp(t, "--config", cfg, "doctor", dir)
	if !strings.Contains(out, "store              "+fileStore) {
		t.Errorf("file setting not used:\n%s", out)
	}
	t.Setenv("TIERFS_REMOTE", envStore)
	out, _ = runApp(t, "--config", cfg, "doctor", dir)
	if !strings.Contains(out, envStore) || strings.Contains(out, fileStore) {
		t.Errorf("the environment does not win over the file:\n%s", out)
	}
	out, _ = runApp(t, "--config", cfg, "doctor", "--remote", flagStore, dir)
	if !strings.Contains(out, flagStore) || strings.Contains(out, envStore) {
		t.Errorf("the command line does not win:\n%s", out)
	}
	// TIERFS_CONFIG names the file too.
	t.Setenv("TIERFS_REMOTE", "")
	os.Unsetenv("TIERFS_REMOTE")
	t.Setenv("TIERFS_CONFIG", cfg)
	if out, _ = runApp(t, "doctor", dir); !strings.Contains(out, fileStore) {
		t.Errorf("TIERFS_CONFIG not read:\n%s", out)
	}
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	for text, want := range map[string]string{
		"remot: file:///x\n":      `no command has a setting "remot"`,
		"json: maybe\n":           "json",
		"remote:\n  nested: 1\n":  "a setting is a single value",
		"remote: [a, b]\n":        "a setting is a single value",
		"remote:\n":               "has no value",
		"remote: 'unterminated\n": "tierfs.yaml",
		"ship-after: [\n":         "tierfs.yaml",
	} {
		_, err := runApp(t, "--config", writeConfig(t, text), "status", dir)
		if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), want) {
			t.Errorf("config %q: %v, want exit 2 with %q", text, err, want)
		}
	}
	if _, err := runApp(t, "--config", filepath.Join(dir, "missing.yaml"), "status", dir); err == nil || exitCode(err) != 2 {
		t.Errorf("missing config file: %v", err)
	}
	// An empty file is no settings.
	if _, err := runApp(t, "--config", writeConfig(t, ""), "status", dir); err != nil {
		t.Errorf("empty config file: %v", err)
	}
}

// TestContribConfig: the example config file names only real settings
// with values their flags accept.
func TestContribConfig(t *testing.T) {
	path := filepath.Join("..", "..", "contrib", "tierfs.yaml")
	settings, err := readConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	known := allFlagNames(newApp())
	for k := range settings {
		if !known[k] {
			t.Errorf("%s: unknown setting %q", path, k)
		}
	}
	// Applied to the mount command's flags, every value parses (the
	// mount itself then stops at its missing mount point argument).
	_, err = runApp(t, "--config", path, "mount")
	if err == nil || !strings.Contains(err.Error(), "MOUNTPOINT") && !strings.Contains(err.Error(), "mount point") {
		t.Fatalf("mount with the example config: %v", err)
	}
}

// TestSizeFlagsTakeUnits: every size flag of mount takes a size with
// units, on the command line and in the configuration file, and a bad
// one is refused naming the flag.
func TestSizeFlagsTakeUnits(t *testing.T) {
	app := &cli.App{Flags: []cli.Flag{
		&cli.StringFlag{Name: "cache-bytes", Value: "256MiB"},
		&cli.StringFlag{Name: "local-retention-bytes", Value: "0"},
	}, Action: func(c *cli.Context) error {
		sizes, err := sizeFlags(c, "cache-bytes", "local-retention-bytes")
		if err != nil {
			return err
		}
		if sizes["cache-bytes"] != 16<<20 || sizes["local-retention-bytes"] != 50e9 {
			t.Errorf("sizes %v", sizes)
		}
		return nil
	}}
	if err := app.Run([]string{"tierfs", "--cache-bytes", "16MiB", "--local-retention-bytes", "50GB"}); err != nil {
		t.Fatal(err)
	}
	app.Action = func(c *cli.Context) error { _, err := sizeFlags(c, "cache-bytes"); return err }
	err := app.Run([]string{"tierfs", "--cache-bytes", "16 mebibytes"})
	if err == nil || !strings.Contains(err.Error(), "--cache-bytes") {
		t.Errorf("a bad size: %v", err)
	}
}

// TestChunkMemoryBelowOneChunkIsRefused: a budget no read could be
// served from is refused with what to use instead.
func TestChunkMemoryBelowOneChunkIsRefused(t *testing.T) {
	_, err := chunkPool(1<<20, slog.New(slog.DiscardHandler))
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(err.Error(), "--cache-bytes 1.0 MiB is less than one chunk (8.0 MiB)") || !strings.Contains(err.Error(), "at least 8MiB") {
		t.Fatalf("--cache-bytes 1MiB: %v", err)
	}
}
