// Command tierfs mounts a Kafka log directory and tiers its cold segments
// to object storage.
package main

import (
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	if filepath.Base(os.Args[0]) == mountHelperName {
		os.Exit(mountHelper(os.Args[1:]))
	}
	if err := Main(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "tierfs:", err)
		os.Exit(exitCode(err))
	}
}
