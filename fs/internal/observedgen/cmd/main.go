// Command cmd writes fs/ops_observed.go (go generate ./fs).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/tierfs/tierfs/fs/internal/observedgen"
)

func main() {
	out := flag.String("o", "ops_observed.go", "file to write")
	flag.Parse()
	src, err := observedgen.Source()
	if err == nil {
		err = os.WriteFile(*out, src, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "observedgen:", err)
		os.Exit(1)
	}
}
