// Command tierfs mounts a Kafka log directory and tiers its cold segments
// to object storage.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := Main(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "tierfs:", err)
		os.Exit(exitCode(err))
	}
}
