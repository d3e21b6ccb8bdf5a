package benchutil

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// OutEnv names the directory every benchmark also writes its Report to,
// as <Name>.json, for bench/report to gather into BENCHMARKS.md.
const OutEnv = "TIERFS_BENCH_OUT"

// A Report is one benchmark's result: a markdown table with the notes
// that say how it was measured, and the throughputs to chart.
type Report struct {
	Name     string            `json:"name"`  // file name and order key: "local", "kafka"
	Title    string            `json:"title"` // a heading
	Notes    []string          `json:"notes"` // paragraphs before the table: parameters, what the ratios are to
	Header   []string          `json:"header"`
	Rows     [][]string        `json:"rows"`
	After    []string          `json:"after,omitempty"`    // lines after the table
	Versions map[string]string `json:"versions,omitempty"` // peers and servers measured: "fio": "3.33"
	Charts   []Chart           `json:"charts,omitempty"`
	Ran      string            `json:"ran,omitempty"` // when: set by Emit
}

// A Chart is one metric across configurations: a panel of bars.
type Chart struct {
	Title string `json:"title"` // "Kafka produce"
	Unit  string `json:"unit"`  // "MB/s"
	Bars  []Bar  `json:"bars"`
	// LowerIsBetter marks a time rather than a throughput.
	LowerIsBetter bool `json:"lower_is_better,omitempty"`
}

// A Bar is one configuration's median.
type Bar struct {
	Label string  `json:"label"`
	Value float64 `json:"value"`
}

// Markdown writes the report's notes and table.
func (r *Report) Markdown(w io.Writer) {
	for _, n := range r.Notes {
		fmt.Fprintf(w, "%s\n\n", n)
	}
	if len(r.Header) > 0 {
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells(r.Header), " | "))
		fmt.Fprintf(w, "|%s\n", strings.Repeat("---|", len(r.Header)))
		for _, row := range r.Rows {
			fmt.Fprintf(w, "| %s |\n", strings.Join(cells(row), " | "))
		}
	}
	if len(r.After) > 0 {
		fmt.Fprintln(w)
		for _, a := range r.After {
			fmt.Fprintf(w, "%s\n\n", a)
		}
	}
}

// cells escapes the pipes in table cells.
func cells(row []string) []string {
	out := make([]string, len(row))
	for i, c := range row {
		out[i] = strings.ReplaceAll(c, "|", `\|`)
	}
	return out
}

// Emit prints the report as markdown on stdout and, when OutEnv names a
// directory, writes it there as JSON too.
func (r *Report) Emit() error {
	fmt.Println()
	r.Markdown(os.Stdout)
	dir := os.Getenv(OutEnv)
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	r.Ran = time.Now().UTC().Format("2006-01-02 15:04 MST")
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, r.Name+".json"), b, 0o644)
}

// ReadReports reads every report in dir, in name order.
func ReadReports(dir string) ([]Report, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var out []Report
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var r Report
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		if r.Name == "" {
			return nil, fmt.Errorf("%s: a report with no name", f)
		}
		out = append(out, r)
	}
	return out, nil
}

// F formats a number for a table: no decimals from 100 up, else up to 2
// significant decimals.
func F(x float64) string {
	switch {
	case x >= 100 || x <= -100:
		return fmt.Sprintf("%.0f", x)
	case x >= 10 || x <= -10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}

// Ratios are a[i]/b[i] for each run both have.
func Ratios(a, b []float64) []float64 {
	var out []float64
	for i := range min(len(a), len(b)) {
		out = append(out, a[i]/b[i])
	}
	return out
}
