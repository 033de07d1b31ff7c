//! A small line-plot writer for `report --plot`: log2 x axis, linear y axis, one coloured line per series,
//! a legend, rendered into an RGB raster with a built-in 3x5 pixel font and saved as PNG (zlib "stored"
//! blocks, so no compression library is needed).

use std::path::Path;

use fused_attn::{Error, Result};

pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

pub struct Plot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

const W: usize = 960;
const H: usize = 600;
const LEFT: usize = 80;
const RIGHT: usize = 260;
const TOP: usize = 50;
const BOTTOM: usize = 60;
const COLORS: [[u8; 3]; 16] = [
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
    [140, 86, 75],
    [227, 119, 194],
    [127, 127, 127],
    [188, 189, 34],
    [23, 190, 207],
    [0, 0, 128],
    [128, 128, 0],
    [0, 128, 128],
    [255, 0, 255],
    [90, 90, 30],
    [0, 0, 0],
];

struct Canvas {
    px: Vec<u8>,
}

impl Canvas {
    fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if x >= 0 && y >= 0 && (x as usize) < W && (y as usize) < H {
            let i = (y as usize * W + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }
    fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), c: [u8; 3], thick: i64) {
        let steps = (x1 - x0).abs().max((y1 - y0).abs()).max(1);
        for s in 0..=steps {
            let x = x0 + (x1 - x0) * s / steps;
            let y = y0 + (y1 - y0) * s / steps;
            for dx in 0..thick {
                for dy in 0..thick {
                    self.set(x + dx, y + dy, c);
                }
            }
        }
    }
    /// Text in the 3x5 font scaled by `scale`, left edge at x, top at y.
    fn text(&mut self, x: i64, y: i64, s: &str, scale: i64, c: [u8; 3]) {
        for (i, ch) in s.chars().enumerate() {
            let g = glyph(ch);
            for (row, bits) in g.iter().enumerate() {
                for col in 0..3 {
                    if bits & (4 >> col) != 0 {
                        for dx in 0..scale {
                            for dy in 0..scale {
                                self.set(x + (i as i64 * 4 + col) * scale + dx, y + row as i64 * scale + dy, c);
                            }
                        }
                    }
                }
            }
        }
    }
}

fn text_width(s: &str, scale: i64) -> i64 {
    s.chars().count() as i64 * 4 * scale
}

/// 3x5 glyphs, one row per entry, bit 2 = left column. Lower case renders as upper case.
fn glyph(c: char) -> [u8; 5] {
    match c.to_ascii_uppercase() {
        '0' => [7, 5, 5, 5, 7],
        '1' => [2, 6, 2, 2, 7],
        '2' => [7, 1, 7, 4, 7],
        '3' => [7, 1, 7, 1, 7],
        '4' => [5, 5, 7, 1, 1],
        '5' => [7, 4, 7, 1, 7],
        '6' => [7, 4, 7, 5, 7],
        '7' => [7, 1, 1, 1, 1],
        '8' => [7, 5, 7, 5, 7],
        '9' => [7, 5, 7, 1, 7],
        'A' => [2, 5, 7, 5, 5],
        'B' => [6, 5, 6, 5, 6],
        'C' => [3, 4, 4, 4, 3],
        'D' => [6, 5, 5, 5, 6],
        'E' => [7, 4, 6, 4, 7],
        'F' => [7, 4, 6, 4, 4],
        'G' => [3, 4, 5, 5, 3],
        'H' => [5, 5, 7, 5, 5],
        'I' => [7, 2, 2, 2, 7],
        'J' => [1, 1, 1, 5, 2],
        'K' => [5, 5, 6, 5, 5],
        'L' => [4, 4, 4, 4, 7],
        'M' => [5, 7, 7, 5, 5],
        'N' => [6, 5, 5, 5, 5],
        'O' => [2, 5, 5, 5, 2],
        'P' => [6, 5, 6, 4, 4],
        'Q' => [2, 5, 5, 6, 3],
        'R' => [6, 5, 6, 5, 5],
        'S' => [3, 4, 2, 1, 6],
        'T' => [7, 2, 2, 2, 2],
        'U' => [5, 5, 5, 5, 7],
        'V' => [5, 5, 5, 5, 2],
        'W' => [5, 5, 7, 7, 5],
        'X' => [5, 5, 2, 5, 5],
        'Y' => [5, 5, 2, 2, 2],
        'Z' => [7, 1, 2, 4, 7],
        '.' => [0, 0, 0, 0, 2],
        ',' => [0, 0, 0, 2, 4],
        ':' => [0, 2, 0, 2, 0],
        '-' => [0, 0, 7, 0, 0],
        '+' => [0, 2, 7, 2, 0],
        '=' => [0, 7, 0, 7, 0],
        '%' => [5, 1, 2, 4, 5],
        '/' => [1, 1, 2, 4, 4],
        '(' => [1, 2, 2, 2, 1],
        ')' => [4, 2, 2, 2, 4],
        '_' => [0, 0, 0, 0, 7],
        _ => [0, 0, 0, 0, 0],
    }
}

fn nice_step(range: f64) -> f64 {
    let raw = range / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag)
}

fn fmt_tick(v: f64) -> String {
    if v >= 1024.0 && (v / 1024.0).fract() == 0.0 {
        format!("{}K", v / 1024.0)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

impl Plot {
    pub fn render(&self) -> Vec<u8> {
        let mut cv = Canvas { px: vec![255; W * H * 3] };
        let pts: Vec<(f64, f64)> = self.series.iter().flat_map(|s| s.points.iter().copied()).collect();
        let (xmin, xmax) = pts.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
        let ymax = pts.iter().fold(0f64, |a, p| a.max(p.1)).max(1e-9) * 1.1;
        let (lx0, lx1) = (xmin.max(1.0).log2(), xmax.max(2.0).log2().max(xmin.max(1.0).log2() + 1.0));
        let pw = (W - LEFT - RIGHT) as f64;
        let ph = (H - TOP - BOTTOM) as f64;
        let sx = |x: f64| LEFT as i64 + ((x.max(1.0).log2() - lx0) / (lx1 - lx0) * pw) as i64;
        let sy = |y: f64| (H - BOTTOM) as i64 - (y / ymax * ph) as i64;
        let black = [0, 0, 0];
        let grey = [220, 220, 220];
        // Grid and ticks.
        let step = nice_step(ymax);
        let mut y = 0.0;
        while y <= ymax {
            cv.line((LEFT as i64, sy(y)), ((W - RIGHT) as i64, sy(y)), grey, 1);
            let t = fmt_tick(y);
            cv.text(LEFT as i64 - 8 - text_width(&t, 2), sy(y) - 5, &t, 2, black);
            y += step;
        }
        let mut e = lx0.ceil() as i32;
        while (e as f64) <= lx1 + 1e-9 {
            let x = 2f64.powi(e);
            cv.line((sx(x), TOP as i64), (sx(x), (H - BOTTOM) as i64), grey, 1);
            let t = fmt_tick(x);
            cv.text(sx(x) - text_width(&t, 2) / 2, (H - BOTTOM) as i64 + 8, &t, 2, black);
            e += 1;
        }
        cv.line((LEFT as i64, TOP as i64), (LEFT as i64, (H - BOTTOM) as i64), black, 2);
        cv.line((LEFT as i64, (H - BOTTOM) as i64), ((W - RIGHT) as i64, (H - BOTTOM) as i64), black, 2);
        cv.text(LEFT as i64, 15, &self.title, 3, black);
        cv.text((W - RIGHT) as i64 / 2, (H - BOTTOM) as i64 + 32, &self.x_label, 2, black);
        cv.text(8, TOP as i64 - 22, &self.y_label, 2, black);
        // Series and legend.
        for (i, s) in self.series.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            let mut p: Vec<(f64, f64)> = s.points.clone();
            p.sort_by(|a, b| a.0.total_cmp(&b.0));
            for w in p.windows(2) {
                cv.line((sx(w[0].0), sy(w[0].1)), (sx(w[1].0), sy(w[1].1)), c, 2);
            }
            for &(x, y) in &p {
                for dx in -3..=3 {
                    for dy in -3..=3 {
                        cv.set(sx(x) + dx, sy(y) + dy, c);
                    }
                }
            }
            let ly = TOP as i64 + 10 + i as i64 * 22;
            let lx = (W - RIGHT) as i64 + 15;
            cv.line((lx, ly + 4), (lx + 20, ly + 4), c, 3);
            cv.text(lx + 28, ly, &s.label, 2, black);
        }
        encode_png(&cv.px)
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.render())
            .map_err(|e| Error::usage(format!("cannot write plot {}: {e}", path.display())))
    }
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &x in data {
        a = (a + x as u32) % 65521;
        b = (b + a) % 65521;
    }
    (b << 16) | a
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let mut body = kind.to_vec();
    body.extend_from_slice(data);
    out.extend_from_slice(&body);
    out.extend_from_slice(&crc32(&body).to_be_bytes());
}

fn encode_png(rgb: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(H * (W * 3 + 1));
    for row in rgb.chunks(W * 3) {
        raw.push(0); // filter: none
        raw.extend_from_slice(row);
    }
    let mut z = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65535).collect();
    for (i, blk) in blocks.iter().enumerate() {
        z.push(u8::from(i + 1 == blocks.len()));
        let len = blk.len() as u16;
        z.extend_from_slice(&len.to_le_bytes());
        z.extend_from_slice(&(!len).to_le_bytes());
        z.extend_from_slice(blk);
    }
    z.extend_from_slice(&adler32(&raw).to_be_bytes());
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&(W as u32).to_be_bytes());
    ihdr.extend_from_slice(&(H as u32).to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut png, b"IHDR", &ihdr);
    chunk(&mut png, b"IDAT", &z);
    chunk(&mut png, b"IEND", &[]);
    png
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_and_adler_known_values() {
        assert_eq!(crc32(b"IEND"), 0xae42_6082);
        assert_eq!(adler32(b"Wikipedia"), 0x11e6_0398);
    }

    #[test]
    fn renders_a_valid_png() {
        let plot = Plot {
            title: "prefill bf16 D=128".into(),
            x_label: "seqlen".into(),
            y_label: "TFLOPS".into(),
            series: vec![Series {
                label: "causal".into(),
                points: vec![(512.0, 100.0), (1024.0, 200.0), (8192.0, 350.0)],
            }],
        };
        let png = plot.render();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&png[12..16], b"IHDR");
        assert!(png.len() > W * H * 3);
    }
}
