// Command report gathers the reports the benchmarks wrote (benchutil.Report,
// one JSON file each in -in) into one markdown file with the machine, the
// versions of everything measured, every table, and a PNG chart of each
// metric by configuration.
//
//	go run ./bench/report -in DIR -out BENCHMARKS.md -chart docs/benchmarks.png
package main

import (
	"bytes"
	"flag"
	"fmt"
	"image/color"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/tierfs/tierfs/bench/internal/benchutil"
)

// order is the order of the sections; reports of other names follow.
var order = []string{"local", "kafka", "kafkastart", "kafkacatchup", "tier", "tierload", "xfer", "cm", "peer", "segscan", "scale", "scale-s3"}

// make targets, named in each section.
var targets = map[string]string{"local": "bench-local", "kafka": "bench-kafka", "kafkastart": "bench-kafka", "kafkacatchup": "bench-kafka", "tier": "bench-tier", "tierload": "bench-tier", "xfer": "bench-xfer", "cm": "bench-cm", "peer": "bench-peer", "segscan": "bench-scan", "scale": "bench-scale", "scale-s3": "bench-scale"}

func main() {
	in := flag.String("in", "", "directory of the benchmarks' JSON reports")
	out := flag.String("out", "BENCHMARKS.md", "markdown file to write")
	chart := flag.String("chart", "docs/benchmarks.png", "PNG chart to write (linked from the markdown by its path relative to it)")
	mode := flag.String("mode", "full", "the mode the benchmarks ran in, for the header (full or quick)")
	failed := flag.String("failed", "", "comma-separated benchmarks that failed, for the header")
	took := flag.Duration("took", 0, "how long the benchmarks ran, for the header")
	tierfsVersion := flag.String("tierfs-version", "", "the version of tierfs measured (default: git describe now)")
	flag.Parse()
	if *in == "" {
		fail(fmt.Errorf("-in is required"))
	}
	reps, err := benchutil.ReadReports(*in)
	if err != nil {
		fail(err)
	}
	if len(reps) == 0 {
		fail(fmt.Errorf("no reports in %s", *in))
	}
	sortReports(reps)
	png, err := renderChart(reps)
	if err != nil {
		fail(err)
	}
	if err := os.MkdirAll(filepath.Dir(*chart), 0o755); err != nil {
		fail(err)
	}
	if err := os.WriteFile(*chart, png, 0o644); err != nil {
		fail(err)
	}
	rel, err := filepath.Rel(filepath.Dir(*out), *chart)
	if err != nil {
		rel = *chart
	}
	var md bytes.Buffer
	writeMarkdown(&md, reps, header{Mode: *mode, Failed: splitList(*failed), Took: *took, Chart: filepath.ToSlash(rel), Versions: versions(reps, *tierfsVersion)})
	if err := os.WriteFile(*out, md.Bytes(), 0o644); err != nil {
		fail(err)
	}
	fmt.Fprintf(os.Stderr, "wrote %s and %s (%d benchmarks)\n", *out, *chart, len(reps))
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func sortReports(reps []benchutil.Report) {
	rank := func(name string) int {
		if i := slices.Index(order, name); i >= 0 {
			return i
		}
		return len(order)
	}
	slices.SortStableFunc(reps, func(a, b benchutil.Report) int {
		if d := rank(a.Name) - rank(b.Name); d != 0 {
			return d
		}
		return strings.Compare(a.Name, b.Name)
	})
}

type header struct {
	Mode     string
	Failed   []string
	Took     time.Duration
	Chart    string
	Versions [][2]string
}

func writeMarkdown(w io.Writer, reps []benchutil.Report, h header) {
	fmt.Fprintf(w, "# Benchmarks\n\n")
	fmt.Fprintf(w, "Written by `make bench%s` on %s", map[bool]string{true: " QUICK=1", false: ""}[h.Mode == "quick"], time.Now().UTC().Format("2006-01-02 15:04 MST"))
	if h.Took > 0 {
		fmt.Fprintf(w, " in %s", h.Took.Round(time.Second))
	}
	fmt.Fprintf(w, ". Every benchmark runs its configurations side by side in each run, and the tables give medians; "+
		"a ratio is the median of the per-run ratios, which is what to read on a noisy machine. Benchmarks are not tests: nothing here is asserted.\n\n")
	if h.Mode == "quick" {
		fmt.Fprintf(w, "**Quick mode**: smaller files, fewer runs and ops than `make bench`; the ratios are rougher.\n\n")
	}
	if len(h.Failed) > 0 {
		fmt.Fprintf(w, "**Failed, and missing below**: %s (see the output of `make bench`).\n\n", strings.Join(h.Failed, ", "))
	}
	fmt.Fprintf(w, "## Machine\n\n%s\n\n", machine())
	fmt.Fprintf(w, "## Versions\n\n| component | version |\n|---|---|\n")
	for _, v := range h.Versions {
		fmt.Fprintf(w, "| %s | %s |\n", v[0], strings.ReplaceAll(v[1], "|", "/"))
	}
	fmt.Fprintf(w, "\n## Throughput by configuration\n\n![throughput by configuration](%s)\n\n", h.Chart)
	fmt.Fprintf(w, "Grey bars are the baselines (the native directory, raw S3 calls, `cat`), blue ones tierfs, orange ones its peers.\n\n")
	for _, r := range reps {
		fmt.Fprintf(w, "## %s", r.Title)
		if t, ok := targets[r.Name]; ok {
			fmt.Fprintf(w, " (`make %s`)", t)
		}
		fmt.Fprintf(w, "\n\n")
		if r.Ran != "" {
			fmt.Fprintf(w, "Measured %s.\n\n", r.Ran)
		}
		r.Markdown(w)
		fmt.Fprintln(w)
	}
}

// machine describes the CPU, memory, kernel and the file system the
// benchmarks' work directories are on.
func machine() string {
	model := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		if m := regexp.MustCompile(`(?m)^model name\s*:\s*(.+)$`).FindSubmatch(b); m != nil {
			model = string(m[1])
		}
	}
	var fsType string
	if out, err := exec.Command("stat", "-f", "-c", "%T", "/var/tmp").Output(); err == nil {
		fsType = strings.TrimSpace(string(out))
	}
	return fmt.Sprintf("%s; CPU %s; /var/tmp on %s.", benchutil.Machine(), model, fsType)
}

// versions lists tierfs, Go, Java, and every peer and server the reports
// name, with the versions on this machine of the tools they run.
func versions(reps []benchutil.Report, tierfs string) [][2]string {
	if tierfs == "" {
		tierfs = firstLine("git", "describe", "--always", "--dirty")
	}
	out := [][2]string{
		{"tierfs", tierfs},
		{"Go", runtime.Version()},
	}
	var u unix.Utsname
	unix.Uname(&u)
	out = append(out, [2]string{"Linux", unix.ByteSliceToString(u.Release[:])})
	seen := map[string]bool{}
	for _, r := range reps {
		keys := make([]string, 0, len(r.Versions))
		for k := range r.Versions {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if !seen[k] {
				seen[k] = true
				out = append(out, [2]string{k, r.Versions[k]})
			}
		}
	}
	for _, t := range []struct{ name, cmd, arg string }{
		{"Java", "java", "-version"},
		{"fio", "fio", "--version"},
		{"mergerfs", "mergerfs", "--version"},
		{"rclone", "rclone", "version"},
		{"s3fs", "s3fs", "--version"},
		{"rsync", "rsync", "--version"},
	} {
		if !seen[t.name] {
			if v := firstLine(t.cmd, t.arg); v != "" {
				out = append(out, [2]string{t.name, v})
			}
		}
	}
	return out
}

// firstLine is the first non-empty line a command prints (on either
// stream), "" if it cannot run.
func firstLine(cmd string, args ...string) string {
	if _, err := exec.LookPath(cmd); err != nil {
		return ""
	}
	b, _ := exec.Command(cmd, args...).CombinedOutput()
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			return l
		}
	}
	return ""
}

var (
	grey   = color.RGBA{150, 150, 150, 255}
	blue   = color.RGBA{31, 119, 180, 255}
	orange = color.RGBA{255, 127, 14, 255}
)

// kindColor colours a bar by what it is: a baseline, tierfs or a peer.
func kindColor(label string) color.Color {
	l := strings.ToLower(label)
	switch {
	case strings.HasPrefix(l, "native") || strings.HasPrefix(l, "plain") || strings.HasPrefix(l, "raw") || strings.HasPrefix(l, "cat ") || strings.Contains(l, "(baseline)"):
		return grey
	case strings.Contains(l, "mergerfs") || strings.Contains(l, "s3fs") || strings.Contains(l, "rclone") || strings.Contains(l, "rsync") || strings.Contains(l, "nc ") || strings.Contains(l, "(debian)"):
		return orange
	default:
		return blue
	}
}

// renderChart draws every chart of every report as one panel of
// horizontal bars, two panels a row, and encodes the whole as PNG.
func renderChart(reps []benchutil.Report) ([]byte, error) {
	var plots []*plot.Plot
	for _, r := range reps {
		for _, c := range r.Charts {
			p, err := panel(c)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", r.Name, c.Title, err)
			}
			plots = append(plots, p)
		}
	}
	if len(plots) == 0 {
		return nil, fmt.Errorf("the reports have no charts")
	}
	const cols = 2
	rows := (len(plots) + cols - 1) / cols
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
	}
	for i, p := range plots {
		grid[i/cols][i%cols] = p
	}
	panelH := 2.4 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(17*vg.Inch, vg.Length(rows)*panelH), vgimg.UseDPI(96))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Inch / 4, PadY: vg.Inch / 6, PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 4}
	canvases := plot.Align(grid, tiles, dc)
	for i := range grid {
		for j, p := range grid[i] {
			if p != nil {
				p.Draw(canvases[i][j])
			}
		}
	}
	var buf bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func panel(c benchutil.Chart) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = c.Title
	p.Title.TextStyle.Font.Size = font.Length(11)
	p.X.Label.Text = c.Unit
	if c.LowerIsBetter {
		p.X.Label.Text += " (lower is better)"
	}
	p.X.Min = 0
	n := len(c.Bars)
	labels := make([]string, n)
	var xys plotter.XYs
	var texts []string
	top := 0.0
	// Bars from the top down in the order given: the first one (the
	// baseline) on top.
	for i, b := range c.Bars {
		y := n - 1 - i
		labels[y] = b.Label
		bc, err := plotter.NewBarChart(plotter.Values{b.Value}, vg.Points(12))
		if err != nil {
			return nil, err
		}
		bc.Horizontal = true
		bc.XMin = float64(y)
		bc.Color = kindColor(b.Label)
		bc.LineStyle.Width = 0
		p.Add(bc)
		xys = append(xys, plotter.XY{X: b.Value, Y: float64(y)})
		texts = append(texts, " "+benchutil.F(b.Value))
		top = max(top, b.Value)
	}
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: texts})
	if err != nil {
		return nil, err
	}
	for i := range l.TextStyle {
		l.TextStyle[i].YAlign = draw.YCenter
		l.TextStyle[i].Font.Size = font.Length(9)
	}
	p.Add(l)
	// Room on the right for the value labels.
	p.X.Max = top * 1.18
	if p.X.Max == 0 {
		p.X.Max = 1
	}
	p.NominalY(labels...)
	p.Y.Tick.Label.Font.Size = font.Length(9)
	p.Y.Min, p.Y.Max = -0.6, float64(n)-0.4
	return p, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/report:", err)
	os.Exit(1)
}
