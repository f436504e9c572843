// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package demo

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/otelcol-llm/otelcol-llm/internal/exphist"
)

// Plot file names in the report folder.
const (
	PlotDistributions = "ttft_tpot_fp16_fp8.png"
	PlotSweep         = "p99_ttft_vs_concurrency.png"
	PlotStalls        = "stalls_kv.png"
	PlotSplit         = "ttft_queue_prefill.png"
)

var (
	colorA     = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff} // fp16, chunked prefill off
	colorB     = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff} // fp8
	colorC     = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff} // chunked prefill on
	colorExtra = color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}
	dashed     = []vg.Length{vg.Points(5), vg.Points(3)}
)

// writePlots draws the plots whose points were run and returns their file
// names.
func writePlots(rep *Report, out string) ([]string, error) {
	var written []string
	byName := map[string]*PointResult{}
	var sweepB, sweepC []*PointResult
	for _, r := range rep.Points {
		byName[r.Point.Name()] = r
		switch r.Point.Scenario {
		case ScenarioSweep:
			sweepB = append(sweepB, r)
		case ScenarioChunked:
			sweepC = append(sweepC, r)
		}
	}
	if fp16, fp8 := byName[ScenarioQuant+"-fp16"], byName[ScenarioQuant+"-fp8"]; fp16 != nil && fp8 != nil {
		if err := plotDistributions(filepath.Join(out, PlotDistributions), fp16, fp8); err != nil {
			return written, err
		}
		written = append(written, PlotDistributions)
	}
	if len(sweepB) > 0 || len(sweepC) > 0 {
		if err := plotSweep(filepath.Join(out, PlotSweep), sweepB, sweepC); err != nil {
			return written, err
		}
		written = append(written, PlotSweep)
		var pts []*PointResult
		for _, s := range [][]*PointResult{sweepB, sweepC} {
			if len(s) > 0 {
				pts = append(pts, s[len(s)-1]) // the highest concurrency
			}
		}
		if err := plotStalls(filepath.Join(out, PlotStalls), pts); err != nil {
			return written, err
		}
		written = append(written, PlotStalls)
	}
	if len(rep.Points) > 0 {
		if err := plotSplit(filepath.Join(out, PlotSplit), rep.Points); err != nil {
			return written, err
		}
		written = append(written, PlotSplit)
		if err := plotAttribution(filepath.Join(out, PlotAttribution), rep.Points); err != nil {
			return written, err
		}
		written = append(written, PlotAttribution)
	}
	return written, nil
}

// plotSplit draws, per scenario, the p50 and p99 of TTFT beside those of its
// two parts, queue and prefill, as the collector reports them: (a) a faster
// kernel moves prefill, (b) past the KV knee queue time is the TTFT, (c)
// chunked prefill moves both.
func plotSplit(path string, pts []*PointResult) error {
	var tiles []*plot.Plot
	for _, sc := range []string{ScenarioQuant, ScenarioSweep, ScenarioChunked} {
		var rs []*PointResult
		for _, r := range pts {
			if r.Point.Scenario == sc {
				rs = append(rs, r)
			}
		}
		if len(rs) == 0 {
			continue
		}
		p := newPlot()
		p.Title.Text = splitTitles[sc]
		p.Y.Label.Text = "ms (log scale)"
		p.Y.Scale = plot.LogScale{}
		p.Legend.Top, p.Legend.Left = true, true
		var ticks []plot.Tick
		for i, r := range rs {
			label := r.Point.Label
			if sc != ScenarioQuant {
				label = fmt.Sprint(r.concurrency())
			}
			ticks = append(ticks, plot.Tick{Value: float64(i), Label: label})
		}
		p.X.Label.Text = "concurrent requests"
		if sc == ScenarioQuant {
			p.X.Label.Text = fmt.Sprintf("engine profile (%d concurrent requests)", rs[0].concurrency())
		}
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
		p.X.Min, p.X.Max = -0.3, float64(len(rs))-0.7
		series := func(y func(*PointResult) float64) plotter.XYs {
			var xys plotter.XYs
			for i, r := range rs {
				if v := y(r); !math.IsNaN(v) {
					xys = append(xys, plotter.XY{X: float64(i), Y: max(v, 0.1)}) // a log scale has no 0
				}
			}
			return xys
		}
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, l := range []struct {
			name  string
			c     color.Color
			dash  bool
			glyph draw.GlyphDrawer
			y     func(*PointResult) float64
		}{
			{"TTFT p99", colorA, false, draw.CircleGlyph{}, func(r *PointResult) float64 { return r.Collector.TTFT.P99 }},
			{"TTFT p50", colorA, true, draw.CircleGlyph{}, func(r *PointResult) float64 { return r.Collector.TTFT.P50 }},
			{"queue p99", colorB, false, draw.TriangleGlyph{}, func(r *PointResult) float64 { return r.Collector.Queue.P99 }},
			{"queue p50", colorB, true, draw.TriangleGlyph{}, func(r *PointResult) float64 { return r.Collector.Queue.P50 }},
			{"prefill p99", colorC, false, draw.SquareGlyph{}, func(r *PointResult) float64 { return r.Collector.Prefill.P99 }},
			{"prefill p50", colorC, true, draw.SquareGlyph{}, func(r *PointResult) float64 { return r.Collector.Prefill.P50 }},
		} {
			xys := series(l.y)
			for _, xy := range xys {
				lo, hi = min(lo, xy.Y), max(hi, xy.Y)
			}
			if err := addSweepLine(p, l.name, xys, l.c, l.dash, l.glyph); err != nil {
				return err
			}
		}
		if hi >= lo {
			// The legend's six lines take the top third of the panel:
			// room for them above the highest point, so that they cover
			// none.
			span := math.Log10(hi/lo) + 0.2
			p.Y.Min = lo / math.Pow(10, 0.1)
			p.Y.Max = p.Y.Min * math.Pow(10, span/0.62)
			p.Y.Tick.Marker = logTicks{top: hi * math.Pow(10, 0.1)}
		}
		tiles = append(tiles, p)
	}
	return saveTiles(path, [][]*plot.Plot{tiles}, vg.Length(len(tiles))*5*vg.Inch, 4.5*vg.Inch)
}

// splitTitles are short enough for a third of the split plot's width.
var splitTitles = map[string]string{
	ScenarioQuant:   "(a) fp16 vs fp8",
	ScenarioSweep:   "(b) chunked prefill off (prefill first)",
	ScenarioChunked: "(c) chunked prefill on (decode first)",
}

// logTicks labels a log axis at 1, 2 and 5 times each power of ten, or at
// the powers of ten alone when the range spans more than two decades
// (gonum's LogTicks labels the powers of ten only: a panel within one
// decade gets one label). No tick above top, where the legend is.
type logTicks struct{ top float64 }

func (lt logTicks) Ticks(lo, hi float64) []plot.Tick {
	mults := []float64{1, 2, 5}
	if lt.top > 0 {
		hi = min(hi, lt.top)
	}
	if hi/lo > 100 {
		mults = []float64{1}
	}
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
		for m := 1.0; m < 10; m++ {
			v := m * math.Pow(10, e)
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if slices.Contains(mults, m) {
				t.Label = strconv.FormatFloat(v, 'f', -1, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// roundTicks puts about six ticks at round values (1, 2 or 5 times a power
// of ten), labeled without trailing zeros: gonum's default ticker labels
// 0 to 25 with two ticks, "0.00" and "25.00".
type roundTicks struct{}

func (roundTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) {
		return []plot.Tick{{Value: lo, Label: fmt.Sprint(lo)}}
	}
	raw := (hi - lo) / 6
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{2, 5, 10} {
		if step >= raw {
			break
		}
		step = m * mag
	}
	// As many decimals as the step has: 3×0.2 prints as 0.6, not
	// 0.6000000000000001.
	decimals := max(0, int(-math.Floor(math.Log10(step)+1e-9)))
	var ticks []plot.Tick
	for k := math.Ceil(lo / step); k*step <= hi+step*1e-9; k++ {
		v := k * step
		label := strconv.FormatFloat(v, 'f', decimals, 64)
		if strings.Trim(label, "-0.") == "" {
			label = "0" // not -0
		}
		ticks = append(ticks, plot.Tick{Value: v, Label: label})
		// Unlabeled minor ticks halfway.
		if mid := v + step/2; mid <= hi {
			ticks = append(ticks, plot.Tick{Value: mid})
		}
	}
	return ticks
}

// newPlot is a plot with round ticks and a grid.
func newPlot() *plot.Plot {
	p := plot.New()
	p.X.Tick.Marker = roundTicks{}
	p.Y.Tick.Marker = roundTicks{}
	p.Add(plotter.NewGrid())
	return p
}

// lighten mixes c halfway with white.
func lighten(c color.RGBA) color.RGBA {
	mix := func(v uint8) uint8 { return v + (0xff-v)/2 }
	return color.RGBA{R: mix(c.R), G: mix(c.G), B: mix(c.B), A: c.A}
}

func newLine(xys plotter.XYs, c color.Color, dash bool) (*plotter.Line, error) {
	l, err := plotter.NewLine(xys)
	if err != nil {
		return nil, err
	}
	l.Color = c
	l.Width = vg.Points(1.5)
	if dash {
		l.Dashes = dashed
	}
	return l, nil
}

// empiricalCDF of the values, as steps.
func empiricalCDF(vals []float64) plotter.XYs {
	v := slices.Clone(vals)
	slices.Sort(v)
	xys := make(plotter.XYs, 0, len(v)+1)
	for i, x := range v {
		xys = append(xys, plotter.XY{X: x, Y: float64(i+1) / float64(len(v))})
	}
	return xys
}

func histCDF(h exphist.Histogram, unit float64) plotter.XYs {
	xs, ps := h.CDF()
	xys := make(plotter.XYs, len(xs))
	for i := range xs {
		xys[i] = plotter.XY{X: xs[i] * unit, Y: ps[i]}
	}
	return xys
}

func plotDistributions(path string, fp16, fp8 *PointResult) error {
	tiles := make([]*plot.Plot, 2)
	for i, metric := range []string{"TTFT", "TPOT"} {
		p := newPlot()
		p.Title.Text = metric + " distribution, fp16 vs fp8 (concurrency " + fmt.Sprint(fp16.concurrency()) + ")"
		p.X.Label.Text = metric + " (ms)"
		p.Y.Label.Text = "share of requests at or below"
		p.Y.Min, p.Y.Max = 0, 1
		// Where the curves are not: low on the right for TTFT (they rise
		// early), high and right of the middle for TPOT (fp8 left, fp16
		// far right).
		p.Legend.Top, p.Legend.Left = false, false
		p.Legend.YOffs = vg.Points(40)
		if metric == "TPOT" {
			p.Legend.Top, p.Legend.XOffs, p.Legend.YOffs = true, -0.4*vg.Inch, 0
		}
		for _, s := range []struct {
			r *PointResult
			c color.Color
		}{{fp16, colorA}, {fp8, colorB}} {
			var vals []float64
			for _, q := range s.r.requests {
				if !q.OK {
					continue
				}
				if metric == "TTFT" {
					vals = append(vals, q.TTFTms)
				} else if q.OutputTokens > 1 {
					vals = append(vals, q.TPOTms)
				}
			}
			h := s.r.Collector.ttftHist
			if metric == "TPOT" {
				h = s.r.Collector.tpotHist
			}
			client, err := newLine(empiricalCDF(vals), s.c, false)
			if err != nil {
				return err
			}
			client.StepStyle = plotter.PostStep
			coll, err := newLine(histCDF(h, 1000), s.c, true)
			if err != nil {
				return err
			}
			p.Add(client, coll)
			p.Legend.Add(s.r.Point.Engine.Profile+" client", client)
			p.Legend.Add(s.r.Point.Engine.Profile+" collector", coll)
		}
		tiles[i] = p
	}
	return saveTiles(path, [][]*plot.Plot{tiles}, 11*vg.Inch, 4.5*vg.Inch)
}

func sweepSeries(pts []*PointResult, y func(*PointResult) float64) plotter.XYs {
	var xys plotter.XYs
	for _, r := range pts {
		v := y(r)
		if math.IsNaN(v) {
			continue
		}
		xys = append(xys, plotter.XY{X: float64(r.concurrency()), Y: v})
	}
	return xys
}

func addSweepLine(p *plot.Plot, name string, xys plotter.XYs, c color.Color, dash bool, glyph draw.GlyphDrawer) error {
	return addSweepLineWidth(p, name, xys, c, dash, glyph, vg.Points(1.5))
}

func addSweepLineWidth(p *plot.Plot, name string, xys plotter.XYs, c color.Color, dash bool, glyph draw.GlyphDrawer, width vg.Length) error {
	if len(xys) == 0 {
		return nil
	}
	l, s, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	l.Color, l.Width = c, width
	if dash {
		l.Dashes = dashed
	}
	s.Color, s.Shape, s.Radius = c, glyph, max(vg.Points(3), width)
	p.Add(l, s)
	p.Legend.Add(name, l, s)
	return nil
}

func plotSweep(path string, b, c []*PointResult) error {
	tile := func(title, ylabel string) *plot.Plot {
		p := newPlot()
		p.Title.Text = title
		p.X.Label.Text = "concurrent requests"
		p.Y.Label.Text = ylabel
		p.Y.Min = 0
		p.Legend.Top, p.Legend.Left = true, true
		return p
	}
	p99 := tile("p99 TTFT vs concurrency (10% long prompts)", "p99 TTFT (ms)")
	p50 := tile("p50 TTFT vs concurrency", "p50 TTFT (ms)")
	stalls := tile("stall alerts (collector)", "stall alerts during the point")
	pre := tile("pre-emptions (scraped vllm:num_preemptions_total)", "pre-emptions during the point")
	// Ticks at the sweep's concurrencies, not at round numbers.
	var ticks []plot.Tick
	for _, r := range append(slices.Clone(b), c...) {
		x := float64(r.concurrency())
		if !slices.ContainsFunc(ticks, func(t plot.Tick) bool { return t.Value == x }) {
			ticks = append(ticks, plot.Tick{Value: x, Label: fmt.Sprint(r.concurrency())})
		}
	}
	for _, p := range []*plot.Plot{p99, p50, stalls, pre} {
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
	}
	for _, s := range []struct {
		pts   []*PointResult
		label string
		c     color.RGBA
	}{{b, "chunked prefill off", colorA}, {c, "chunked prefill on", colorC}} {
		if len(s.pts) == 0 {
			continue
		}
		// The collector agrees with the client within a few %: its
		// dashed line is drawn thin on top of the client's wide, pale one,
		// so that both show where they coincide.
		lines := []struct {
			p     *plot.Plot
			name  string
			dash  bool
			wide  bool
			glyph draw.GlyphDrawer
			y     func(*PointResult) float64
		}{
			{p99, s.label + ", client", false, true, draw.CircleGlyph{}, func(r *PointResult) float64 { return r.Client.TTFT.P99 }},
			{p99, s.label + ", collector", true, false, draw.TriangleGlyph{}, func(r *PointResult) float64 { return r.Collector.TTFT.P99 }},
			{p50, s.label + ", client", false, true, draw.CircleGlyph{}, func(r *PointResult) float64 { return r.Client.TTFT.P50 }},
			{p50, s.label + ", collector", true, false, draw.TriangleGlyph{}, func(r *PointResult) float64 { return r.Collector.TTFT.P50 }},
			{stalls, s.label, false, false, draw.SquareGlyph{}, func(r *PointResult) float64 { return float64(len(r.Collector.StallAlerts)) }},
			{pre, s.label, false, false, draw.CircleGlyph{}, func(r *PointResult) float64 { return r.Collector.PreemptionCount }},
		}
		for _, l := range lines {
			c, width := s.c, vg.Points(1.5)
			if l.wide {
				c, width = lighten(s.c), vg.Points(5)
			}
			if err := addSweepLineWidth(l.p, l.name, sweepSeries(s.pts, l.y), c, l.dash, l.glyph, width); err != nil {
				return err
			}
		}
	}
	return saveTiles(path, [][]*plot.Plot{{p99, p50}, {stalls, pre}}, 12*vg.Inch, 8*vg.Inch)
}

func plotStalls(path string, pts []*PointResult) error {
	kv := newPlot()
	kv.Title.Text = "engine KV-cache usage (scraped every 500 ms) and stall alerts (x) at the KV usage they carry"
	kv.Y.Label.Text = "KV usage (%)"
	// Room above 100% for the legend, which would otherwise cover the line
	// where the pool is full and the stall alerts on it.
	kv.Y.Min, kv.Y.Max = 0, 135
	var kvTicks []plot.Tick
	for v := 0; v <= 100; v += 10 {
		t := plot.Tick{Value: float64(v)}
		if v%20 == 0 {
			t.Label = strconv.Itoa(v)
		}
		kvTicks = append(kvTicks, t)
	}
	kv.Y.Tick.Marker = plot.ConstantTicks(kvTicks)
	stalls := newPlot()
	stalls.Title.Text = "stall alerts (cumulative, by the time of detection)"
	stalls.Y.Label.Text = "stall alerts"
	pre := newPlot()
	pre.Title.Text = "pre-emptions (vllm:num_preemptions_total, scraped)"
	pre.Y.Label.Text = "pre-emptions"
	pre.X.Label.Text = "seconds since the load started"
	for _, p := range []*plot.Plot{kv, stalls, pre} {
		p.Legend.Top, p.Legend.Left = true, true
		p.X.Min = 0
		p.Y.Min = 0
	}
	colors := []color.Color{colorA, colorC, colorExtra}
	for i, r := range pts {
		col := colors[i%len(colors)]
		name := fmt.Sprintf("%s (concurrency %d)", r.Point.Name(), r.concurrency())
		k := r.Collector
		var kvXY, alertXY, cumXY, preXY plotter.XYs
		for _, s := range k.KVUsage {
			kvXY = append(kvXY, plotter.XY{X: s.T, Y: 100 * s.V})
		}
		cumXY = append(cumXY, plotter.XY{})
		for j, a := range k.StallAlerts {
			if a.KVUsage >= 0 {
				alertXY = append(alertXY, plotter.XY{X: a.T, Y: 100 * a.KVUsage})
			}
			cumXY = append(cumXY, plotter.XY{X: a.T, Y: float64(j + 1)})
		}
		for _, s := range k.Preemptions {
			preXY = append(preXY, plotter.XY{X: s.T, Y: s.V})
		}
		if len(kvXY) > 0 {
			l, err := newLine(kvXY, col, false)
			if err != nil {
				return err
			}
			kv.Add(l)
			kv.Legend.Add(name+": KV usage", l)
		}
		if len(alertXY) > 0 {
			sc, err := plotter.NewScatter(alertXY)
			if err != nil {
				return err
			}
			sc.Color, sc.Shape, sc.Radius = col, draw.CrossGlyph{}, vg.Points(3)
			kv.Add(sc)
			kv.Legend.Add(name+": stall alert", sc)
		}
		l, err := newLine(cumXY, col, false)
		if err != nil {
			return err
		}
		l.StepStyle = plotter.PostStep
		stalls.Add(l)
		stalls.Legend.Add(name, l)
		if len(preXY) > 0 {
			l, err := newLine(preXY, col, false)
			if err != nil {
				return err
			}
			pre.Add(l)
			pre.Legend.Add(name, l)
		}
	}
	// One time axis for all three.
	var xmax float64
	for _, p := range []*plot.Plot{kv, stalls, pre} {
		xmax = max(xmax, p.X.Max)
	}
	for _, p := range []*plot.Plot{kv, stalls, pre} {
		p.X.Max = xmax
	}
	return saveTiles(path, [][]*plot.Plot{{kv}, {stalls}, {pre}}, 10*vg.Inch, 10*vg.Inch)
}

func saveTiles(path string, plots [][]*plot.Plot, w, h vg.Length) error {
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(100))
	dc := draw.New(img)
	t := draw.Tiles{
		Rows: len(plots), Cols: len(plots[0]),
		PadX: vg.Millimeter * 6, PadY: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4,
	}
	canvases := plot.Align(plots, t, dc)
	for j := range plots {
		for i := range plots[j] {
			plots[j][i].Draw(canvases[j][i]) //nolint:gosec // G602: plot.Align returns canvases of plots' shape
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
