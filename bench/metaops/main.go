// Command metaops times the metadata pattern of a log directory: create N
// files, stat each, list the directory, and prints the seconds it took.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

func main() {
	n := flag.Int("n", 30000, "number of files")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: metaops [-n N] DIR")
		os.Exit(2)
	}
	dir := flag.Arg(0)
	start := time.Now()
	for i := range *n {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%020d.log", i)))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		f.Close()
	}
	for i := range *n {
		if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("%020d.log", i))); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) != *n {
		fmt.Fprintln(os.Stderr, "readdir:", err, len(ents))
		os.Exit(1)
	}
	fmt.Printf("%.3f\n", time.Since(start).Seconds())
}
