package main

import (
	"bytes"
	"image/png"
	"strings"
	"testing"

	"github.com/tierfs/tierfs/bench/internal/benchutil"
)

func TestReportGathersTablesAndCharts(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(benchutil.OutEnv, dir)
	for _, r := range []benchutil.Report{
		{Name: "segscan", Title: "Segment scanning", Header: []string{"measurement", "MB/s"}, Rows: [][]string{{"cat", "900"}},
			Charts: []benchutil.Chart{{Title: "scan", Unit: "MB/s", Bars: []benchutil.Bar{{Label: "cat > /dev/null", Value: 900}, {Label: "scan", Value: 1200}}}}},
		{Name: "local", Title: "Local files", Notes: []string{"how it was measured"}, Header: []string{"configuration", "MiB/s", "×"},
			Rows: [][]string{{"native", "1000", "1.00"}, {"tierfs", "950", "0.95"}}, Versions: map[string]string{"fio": "fio-3.33"},
			Charts: []benchutil.Chart{
				{Title: "write", Unit: "MiB/s", Bars: []benchutil.Bar{{Label: "native", Value: 1000}, {Label: "tierfs", Value: 950}, {Label: "mergerfs", Value: 400}}},
				{Title: "meta", Unit: "s", LowerIsBetter: true, Bars: []benchutil.Bar{{Label: "native", Value: 1.5}, {Label: "tierfs", Value: 3}}},
			}},
	} {
		if err := r.Emit(); err != nil {
			t.Fatal(err)
		}
	}
	reps, err := benchutil.ReadReports(dir)
	if err != nil {
		t.Fatal(err)
	}
	sortReports(reps)
	if len(reps) != 2 || reps[0].Name != "local" || reps[1].Name != "segscan" {
		t.Fatalf("reports %v, want local then segscan", reps)
	}
	b, err := renderChart(reps)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	// Three panels: two rows of two.
	if sz := img.Bounds().Size(); sz.X != 17*96 || sz.Y < 400 {
		t.Errorf("chart is %v", sz)
	}
	// The bars are drawn: some pixels have the colour of tierfs's bars.
	blues := 0
	for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y += 2 {
		for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x += 2 {
			r, g, bl, _ := img.At(x, y).RGBA()
			if r>>8 == 31 && g>>8 == 119 && bl>>8 == 180 {
				blues++
			}
		}
	}
	if blues < 100 {
		t.Errorf("%d blue pixels sampled: the bars are missing", blues)
	}
	var md bytes.Buffer
	writeMarkdown(&md, reps, header{Mode: "quick", Failed: []string{"kafka"}, Chart: "docs/b.png", Versions: versions(reps, "v-test")})
	s := md.String()
	for _, want := range []string{"QUICK=1", "**Failed, and missing below**: kafka", "![throughput by configuration](docs/b.png)",
		"## Local files (`make bench-local`)", "how it was measured\n\n| configuration | MiB/s | × |\n|---|---|---|\n| native | 1000 | 1.00 |",
		"| fio | fio-3.33 |", "| tierfs | v-test |", "## Segment scanning (`make bench-scan`)"} {
		if !strings.Contains(s, want) {
			t.Errorf("markdown lacks %q:\n%s", want, s)
		}
	}
	if strings.Index(s, "## Local files") > strings.Index(s, "## Segment scanning") {
		t.Error("sections out of order")
	}
}

func TestKindColor(t *testing.T) {
	for label, want := range map[string]any{"native directory": grey, "plain directory": grey, "raw ranged GET, 1 stream": grey, "cat > /dev/null": grey, "tar | nc (baseline)": grey,
		"mergerfs (Debian)": orange, "rclone mount (Debian), cold sequential read": orange, "s3fs (Debian), cold sequential read": orange, "rsync daemon (Debian)": orange,
		"tierfs --cm": blue, "Uploader": blue, "scan, with CRC32C": blue} {
		if got := kindColor(label); got != want {
			t.Errorf("%q: %v, want %v", label, got, want)
		}
	}
}
