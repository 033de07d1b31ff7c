//! The line-chart renderer behind `--plot` (plotters, PNG): a header (title, run metadata), one or more
//! panels side by side sharing a log2 x axis and a linear y axis, horizontal reference lines (ceilings and
//! targets) and one legend for the whole chart. Text uses DejaVu Sans compiled into the binary (the
//! `dejavu` crate through plotters' ab_glyph backend), so rendering needs no system font.
//!
//! Series are told apart by colour, marker shape and line style together, and every marker is drawn over
//! every line with a white halo, so a series hidden under another still shows its points.

use std::path::Path;
use std::sync::Once;

use fused_attn::{Error, Result};
use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

pub const WIDTH: u32 = 1800;
pub const HEIGHT: u32 = 1000;
const HEADER: u32 = 118;
const LEGEND: u32 = 400;
const FONT: &str = "sans-serif";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    Circle,
    Triangle,
    Square,
    Diamond,
    Plus,
}

/// How a series or a reference line looks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Style {
    pub color: RGBColor,
    pub dashed: bool,
    /// None for a reference line (no markers).
    pub marker: Option<Marker>,
    /// Hollow markers (drawn as outlines).
    pub hollow: bool,
}

#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub style: Style,
    /// (x, y) in data units; x > 0 (drawn on a log2 axis).
    pub points: Vec<(f64, f64)>,
}

/// A horizontal line across a panel: a measured ceiling or a target.
#[derive(Clone, Debug)]
pub struct RefLine {
    pub y: f64,
    /// Short text drawn on the line.
    pub tag: String,
    /// The legend's text.
    pub label: String,
    pub style: Style,
}

#[derive(Clone, Debug)]
pub struct Panel {
    pub title: String,
    pub series: Vec<Series>,
    pub lines: Vec<RefLine>,
}

#[derive(Clone, Debug)]
pub struct Chart {
    pub title: String,
    /// Metadata lines under the title (device, commit, date, ceilings, method).
    pub caption: Vec<String>,
    pub x_label: String,
    pub y_label: String,
    pub panels: Vec<Panel>,
}

/// Registers the embedded font once per process.
fn fonts() -> Result<()> {
    static ONCE: Once = Once::new();
    let mut ok = true;
    ONCE.call_once(|| {
        ok = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
            && plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold()).is_ok();
    });
    ok.then_some(()).ok_or_else(|| Error::usage("plot: the embedded DejaVu Sans font did not load"))
}

/// "512", "1K", "32K", "1M": a power of two as the axis labels it.
pub fn pow2_label(v: f64) -> String {
    match v.round() {
        v if v >= 1048576.0 && v % 1048576.0 == 0.0 => format!("{}M", v / 1048576.0),
        v if v >= 1024.0 && v % 512.0 == 0.0 => format!("{}K", v / 1024.0),
        v => format!("{v}"),
    }
}

/// A log2 axis over data values (sequence lengths, contexts) with a tick at every power of two.
#[derive(Clone)]
struct Log2Axis {
    log_range: Range<f64>,
}

impl Ranged for Log2Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, (lo, hi): (i32, i32)) -> i32 {
        let Range { start, end } = self.log_range;
        let t = (value.max(f64::MIN_POSITIVE).log2() - start) / (end - start);
        lo + (t * f64::from(hi - lo)).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, _hint: Hint) -> Vec<f64> {
        (self.log_range.start.ceil() as i32..=self.log_range.end.floor() as i32).map(|e| 2f64.powi(e)).collect()
    }

    fn range(&self) -> Range<f64> {
        2f64.powf(self.log_range.start)..2f64.powf(self.log_range.end)
    }
}

/// The marker outline in pixels around its centre.
fn outline(m: Marker, r: i32) -> Vec<(i32, i32)> {
    match m {
        Marker::Circle => (0..20)
            .map(|i| {
                let a = i as f64 * std::f64::consts::TAU / 20.0;
                ((r as f64 * a.cos()).round() as i32, (r as f64 * a.sin()).round() as i32)
            })
            .collect(),
        Marker::Triangle => vec![(0, -r - 2), (r + 1, r - 1), (-r - 1, r - 1)],
        Marker::Square => vec![(-r + 1, -r + 1), (r - 1, -r + 1), (r - 1, r - 1), (-r + 1, r - 1)],
        Marker::Diamond => vec![(0, -r - 2), (r + 1, 0), (0, r + 2), (-r - 1, 0)],
        Marker::Plus => {
            let (a, b) = (r / 3 + 1, r + 1);
            vec![
                (-a, -b),
                (a, -b),
                (a, -a),
                (b, -a),
                (b, a),
                (a, a),
                (a, b),
                (-a, b),
                (-a, a),
                (-b, a),
                (-b, -a),
                (-a, -a),
            ]
        }
    }
}

fn draw_err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> Error {
    Error::usage(format!("plot: drawing failed: {e}"))
}

/// A marker at `at` (any coordinate system): a white halo, then the filled shape or its outline.
fn draw_marker<DB: DrawingBackend, CT: CoordTranslate>(
    area: &DrawingArea<DB, CT>,
    at: CT::From,
    m: Marker,
    color: RGBColor,
    hollow: bool,
) -> Result<()>
where
    CT::From: Clone,
{
    const R: i32 = 7;
    area.draw(&(EmptyElement::at(at.clone()) + Polygon::new(outline(m, R + 3), WHITE.filled()))).map_err(draw_err)?;
    if hollow {
        let mut ring = outline(m, R);
        ring.push(ring[0]);
        area.draw(&(EmptyElement::at(at) + PathElement::new(ring, color.stroke_width(3)))).map_err(draw_err)
    } else {
        area.draw(&(EmptyElement::at(at) + Polygon::new(outline(m, R), color.filled()))).map_err(draw_err)
    }
}

/// Dashed or solid polyline through `pts` (any coordinate system).
fn draw_line<DB: DrawingBackend, CT: CoordTranslate>(
    area: &DrawingArea<DB, CT>,
    pts: Vec<CT::From>,
    style: &Style,
    width: u32,
) -> Result<()>
where
    CT::From: Clone,
{
    let stroke = style.color.stroke_width(width);
    if style.dashed {
        area.draw(&DashedPathElement::new(pts, 14, 9, stroke)).map_err(draw_err)
    } else {
        area.draw(&PathElement::new(pts, stroke)).map_err(draw_err)
    }
}

/// Legend text wraps at this many characters (the legend column is LEGEND pixels wide).
const LEGEND_CHARS: usize = 28;

/// Splits `s` at spaces into lines of at most `width` characters (a longer word stays whole).
fn wrap(s: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in s.split(' ') {
        match lines.last_mut() {
            Some(l) if l.chars().count() + 1 + word.chars().count() <= width => {
                l.push(' ');
                l.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

/// Pixels along a segment, every 3 px.
fn sample_segment((ax, ay): (i32, i32), (bx, by): (i32, i32)) -> Vec<(i32, i32)> {
    let n = ((bx - ax).abs().max((by - ay).abs()) / 3).max(1);
    (0..=n).map(|k| (ax + (bx - ax) * k / n, ay + (by - ay) * k / n)).collect()
}

#[derive(Clone, Copy, Debug)]
struct Rect {
    x0: i32,
    y0: i32,
    x1: i32,
    y1: i32,
}

impl Rect {
    fn hits(&self, (x, y): (i32, i32), pad: i32) -> bool {
        x >= self.x0 - pad && x <= self.x1 + pad && y >= self.y0 - pad && y <= self.y1 + pad
    }
    fn overlaps(&self, o: &Rect) -> bool {
        self.x0 < o.x1 && o.x0 < self.x1 && self.y0 < o.y1 && o.y0 < self.y1
    }
}

/// Where a reference line's label goes: just above or below the line at y, anywhere along it, wherever it
/// covers the fewest data pixels and no other label (the leftmost such place).
fn place_label(
    (xr, yr): (Range<i32>, Range<i32>),
    y: i32,
    (w, h): (i32, i32),
    blocked: &[(i32, i32)],
    taken: &[Rect],
) -> Rect {
    let (left, right) = (xr.start + 12, (xr.end - 12 - w).max(xr.start + 12));
    let xs = (left..=right).step_by(20).chain(std::iter::once(right));
    let candidates: Vec<(i32, i32)> = xs.flat_map(|x| [(x, y - 5 - h), (x, y + 5)]).collect();
    let cost = |r: &Rect| {
        let outside = r.y0 < yr.start || r.y1 > yr.end;
        blocked.iter().filter(|p| r.hits(**p, 4)).count()
            + 10_000 * taken.iter().filter(|t| t.overlaps(r)).count()
            + if outside { 100_000 } else { 0 }
    };
    candidates.iter().map(|&(x, y)| Rect { x0: x, y0: y, x1: x + w, y1: y + h }).min_by_key(cost).unwrap_or(Rect {
        x0: left,
        y0: y - 5 - h,
        x1: left + w,
        y1: y - 5,
    })
}

impl Chart {
    fn x_range(&self) -> (f64, f64) {
        let xs = self.panels.iter().flat_map(|p| &p.series).flat_map(|s| &s.points).map(|p| p.0.max(1.0).log2());
        let (lo, hi) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
        if lo > hi {
            (9.0, 14.0)
        } else {
            (lo.floor(), hi.ceil().max(lo.floor() + 1.0))
        }
    }

    fn y_max(&self) -> f64 {
        let data = self.panels.iter().flat_map(|p| &p.series).flat_map(|s| &s.points).map(|p| p.1);
        let refs = self.panels.iter().flat_map(|p| &p.lines).map(|l| l.y);
        data.chain(refs).filter(|y| y.is_finite()).fold(0.0, f64::max).max(1e-9) * 1.1
    }

    /// Renders into `root` (a PNG file, or a buffer in tests).
    pub fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        fonts()?;
        root.fill(&WHITE).map_err(draw_err)?;
        let (header, body) = root.split_vertically(HEADER);
        header
            .draw(&Text::new(self.title.clone(), (24, 14), (FONT, 34, FontStyle::Bold).into_font().color(&BLACK)))
            .map_err(draw_err)?;
        for (i, line) in self.caption.iter().enumerate() {
            let style = (FONT, 20).into_font().color(&RGBColor(60, 60, 60));
            header.draw(&Text::new(line.clone(), (26, 58 + 26 * i as i32), style)).map_err(draw_err)?;
        }
        let (plots, legend) = body.split_horizontally(WIDTH - LEGEND);
        let (x0, x1) = self.x_range();
        let axis = Log2Axis { log_range: x0 - 0.2..x1 + 0.2 };
        let ymax = self.y_max();
        for (area, panel) in plots.split_evenly((1, self.panels.len().max(1))).iter().zip(&self.panels) {
            self.draw_panel(area, panel, axis.clone(), ymax)?;
        }
        self.draw_legend(&legend.margin(40, 10, 10, 10))?;
        root.present().map_err(draw_err)
    }

    fn draw_panel<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        panel: &Panel,
        axis: Log2Axis,
        ymax: f64,
    ) -> Result<()> {
        let Range { start: x0, end: x1 } = axis.range();
        let mut cc = ChartBuilder::on(area)
            .caption(&panel.title, (FONT, 26, FontStyle::Bold))
            .margin(18)
            .x_label_area_size(64)
            .y_label_area_size(84)
            .build_cartesian_2d(axis, 0f64..ymax)
            .map_err(draw_err)?;
        cc.configure_mesh()
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .x_label_formatter(&|v| pow2_label(*v))
            .x_labels(32)
            .y_label_formatter(&|v| format!("{v:.0}"))
            .y_labels(12)
            .label_style((FONT, 19))
            .axis_desc_style((FONT, 21))
            .light_line_style(WHITE)
            .bold_line_style(RGBColor(225, 225, 225))
            .draw()
            .map_err(draw_err)?;
        let area = cc.plotting_area();
        let sorted = |s: &Series| {
            let mut p = s.points.clone();
            p.sort_by(|a, b| a.0.total_cmp(&b.0));
            p
        };
        for line in &panel.lines {
            draw_line(area, vec![(x0, line.y), (x1, line.y)], &line.style, 2)?;
        }
        // Lines first, then every marker on top (fewest points last, so a lone shape stays visible).
        for s in &panel.series {
            draw_line(area, sorted(s), &s.style, 3)?;
        }
        let mut order: Vec<&Series> = panel.series.iter().collect();
        order.sort_by_key(|s| std::cmp::Reverse(s.points.len()));
        for s in order {
            if let Some(m) = s.style.marker {
                for p in sorted(s) {
                    draw_marker(area, p, m, s.style.color, s.style.hollow)?;
                }
            }
        }
        // Reference-line labels where they cover no data: the pixels of every series and line are obstacles.
        let to_px = |p: (f64, f64)| cc.backend_coord(&p);
        let mut obstacles: Vec<(i32, i32)> = Vec::new();
        for s in &panel.series {
            let px: Vec<(i32, i32)> = sorted(s).into_iter().map(to_px).collect();
            obstacles.extend(px.iter().copied());
            for w in px.windows(2) {
                obstacles.extend(sample_segment(w[0], w[1]));
            }
        }
        let line_px: Vec<Vec<(i32, i32)>> =
            panel.lines.iter().map(|l| sample_segment(to_px((x0, l.y)), to_px((x1, l.y)))).collect();
        let plot = area.strip_coord_spec();
        let mut taken: Vec<Rect> = Vec::new();
        for (i, line) in panel.lines.iter().enumerate() {
            let font = (FONT, 18).into_font().color(&line.style.color);
            let (w, h) = plot.estimate_text_size(&line.tag, &font).map_err(draw_err)?;
            let others = line_px.iter().enumerate().filter(|(j, _)| *j != i).flat_map(|(_, px)| px.iter());
            let blocked: Vec<(i32, i32)> = obstacles.iter().chain(others).copied().collect();
            let r = place_label(plot.get_pixel_range(), to_px((x0, line.y)).1, (w as i32, h as i32), &blocked, &taken);
            let base = plot.get_base_pixel();
            plot.draw(&Text::new(line.tag.clone(), (r.x0 - base.0, r.y0 - base.1), font)).map_err(draw_err)?;
            taken.push(r);
        }
        Ok(())
    }

    /// One legend for every panel: each distinct series style, then the reference lines.
    fn draw_legend<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        let mut entries: Vec<(String, Style)> = Vec::new();
        let series = self.panels.iter().flat_map(|p| &p.series).map(|s| (&s.label, s.style));
        let lines = self.panels.iter().flat_map(|p| &p.lines).map(|l| (&l.label, l.style));
        for (label, style) in series.chain(lines) {
            if !entries.iter().any(|(l, _)| l == label) {
                entries.push((label.clone(), style));
            }
        }
        let text = (FONT, 19).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
        let mut y = 12;
        for (label, style) in &entries {
            draw_line(area, vec![(4, y), (64, y)], style, 3)?;
            if let Some(m) = style.marker {
                draw_marker(area, (34, y), m, style.color, style.hollow)?;
            }
            for (k, part) in wrap(label, LEGEND_CHARS).iter().enumerate() {
                area.draw(&Text::new(part.clone(), (78 + if k > 0 { 12 } else { 0 }, y), text.clone()))
                    .map_err(draw_err)?;
                y += 23;
            }
            y += 11;
        }
        Ok(())
    }

    /// Writes the chart as a WIDTH x HEIGHT PNG.
    pub fn write_png(&self, path: &Path) -> Result<()> {
        let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
        self.draw(&root).map_err(|e| Error::usage(format!("{}: {}", path.display(), e.message())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn render_rgb(chart: &Chart) -> Vec<u8> {
        let mut buf = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut buf, (WIDTH, HEIGHT)).into_drawing_area();
            chart.draw(&root).unwrap();
        }
        buf
    }

    /// Pixels of colour `c` in the plotting panels (not the header, not the legend).
    pub fn count_color(rgb: &[u8], c: RGBColor) -> usize {
        let w = WIDTH as usize;
        rgb.chunks(3)
            .enumerate()
            .filter(|(i, p)| i % w < w - LEGEND as usize && i / w > HEADER as usize && *p == [c.0, c.1, c.2])
            .count()
    }

    #[test]
    fn wraps_at_spaces() {
        assert_eq!(
            wrap("target: D=128 T=8K causal ≥ 0.9 × non-causal", 20),
            ["target: D=128 T=8K", "causal ≥ 0.9 ×", "non-causal"]
        );
        assert_eq!(wrap("B=1", 20), ["B=1"]);
    }

    #[test]
    fn tick_labels() {
        assert_eq!(
            [512.0, 1024.0, 32768.0, 131072.0, 1048576.0, 1536.0].map(pow2_label),
            ["512", "1K", "32K", "128K", "1M", "1.5K"]
        );
    }

    #[test]
    fn every_series_and_line_is_drawn_even_when_hidden() {
        let style = |color, dashed, marker| Style { color, dashed, marker: Some(marker), hollow: dashed };
        let a = RGBColor(0, 114, 178);
        let b = RGBColor(213, 94, 0);
        let c = RGBColor(204, 121, 167);
        let line = RGBColor(90, 90, 90);
        let chart = Chart {
            title: "t".into(),
            caption: vec!["c".into()],
            x_label: "x".into(),
            y_label: "y".into(),
            panels: vec![Panel {
                title: "p".into(),
                // b lies exactly on a; c is one point on a's line.
                series: vec![
                    Series {
                        label: "a".into(),
                        style: style(a, false, Marker::Circle),
                        points: vec![(512.0, 10.0), (4096.0, 30.0)],
                    },
                    Series {
                        label: "b".into(),
                        style: style(b, true, Marker::Square),
                        points: vec![(512.0, 10.0), (4096.0, 30.0)],
                    },
                    Series { label: "c".into(), style: style(c, false, Marker::Plus), points: vec![(4096.0, 30.0)] },
                ],
                lines: vec![RefLine {
                    y: 40.0,
                    tag: "c".into(),
                    label: "ceiling".into(),
                    style: Style { color: line, dashed: false, marker: None, hollow: false },
                }],
            }],
        };
        let rgb = render_rgb(&chart);
        for color in [a, b, c, line] {
            assert!(count_color(&rgb, color) > 150, "{color:?}: {}", count_color(&rgb, color));
        }
        // Without the series, its colour is absent from the panels.
        let mut without_b = chart.clone();
        without_b.panels[0].series.remove(1);
        assert_eq!(count_color(&render_rgb(&without_b), b), 0);
    }
}
