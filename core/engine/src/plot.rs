//! A PNG plot of held-out accuracy (or other fractions) against wall time, drawn with a built-in 5×7 bitmap font
//! (no system fonts needed).

use std::path::Path;

/// A line to draw: label, colour, points (x in seconds, y in [0, 1]).
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// RGB colour.
    pub color: [u8; 3],
    /// Points, in order.
    pub points: Vec<(f64, f64)>,
}

const GLYPHS: &[(char, [u8; 7])] = &[
    ('0', [0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E]),
    ('1', [0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E]),
    ('2', [0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F]),
    ('3', [0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E]),
    ('4', [0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02]),
    ('5', [0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E]),
    ('6', [0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E]),
    ('7', [0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08]),
    ('8', [0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E]),
    ('9', [0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C]),
    ('.', [0, 0, 0, 0, 0, 0x0C, 0x0C]),
    ('-', [0, 0, 0, 0x1F, 0, 0, 0]),
    ('(', [0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02]),
    (')', [0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08]),
    (':', [0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0]),
    ('=', [0, 0, 0x1F, 0, 0x1F, 0, 0]),
    (',', [0, 0, 0, 0, 0x0C, 0x04, 0x08]),
    ('%', [0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03]),
    ('/', [0, 0x01, 0x02, 0x04, 0x08, 0x10, 0]),
    ('+', [0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0]),
    ('a', [0, 0, 0x0E, 0x01, 0x0F, 0x11, 0x0F]),
    ('b', [0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E]),
    ('c', [0, 0, 0x0E, 0x10, 0x10, 0x11, 0x0E]),
    ('d', [0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F]),
    ('e', [0, 0, 0x0E, 0x11, 0x1F, 0x10, 0x0E]),
    ('f', [0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08]),
    ('g', [0, 0x0F, 0x11, 0x11, 0x0F, 0x01, 0x0E]),
    ('h', [0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11]),
    ('i', [0x04, 0, 0x0C, 0x04, 0x04, 0x04, 0x0E]),
    ('j', [0x02, 0, 0x06, 0x02, 0x02, 0x12, 0x0C]),
    ('k', [0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12]),
    ('l', [0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E]),
    ('m', [0, 0, 0x1A, 0x15, 0x15, 0x11, 0x11]),
    ('n', [0, 0, 0x16, 0x19, 0x11, 0x11, 0x11]),
    ('o', [0, 0, 0x0E, 0x11, 0x11, 0x11, 0x0E]),
    ('p', [0, 0, 0x1E, 0x11, 0x1E, 0x10, 0x10]),
    ('q', [0, 0, 0x0D, 0x13, 0x0F, 0x01, 0x01]),
    ('r', [0, 0, 0x16, 0x19, 0x10, 0x10, 0x10]),
    ('s', [0, 0, 0x0E, 0x10, 0x0E, 0x01, 0x1E]),
    ('t', [0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06]),
    ('u', [0, 0, 0x11, 0x11, 0x11, 0x13, 0x0D]),
    ('v', [0, 0, 0x11, 0x11, 0x11, 0x0A, 0x04]),
    ('w', [0, 0, 0x11, 0x11, 0x15, 0x15, 0x0A]),
    ('x', [0, 0, 0x11, 0x0A, 0x04, 0x0A, 0x11]),
    ('y', [0, 0, 0x11, 0x11, 0x0F, 0x01, 0x0E]),
    ('z', [0, 0, 0x1F, 0x02, 0x04, 0x08, 0x1F]),
];

struct Canvas {
    width: usize,
    height: usize,
    pixels: Vec<u8>,
    /// Every text drawn, as (left, top, right, bottom) pixels: labels must not overlap.
    text_boxes: Vec<(i64, i64, i64, i64)>,
}

impl Canvas {
    fn new(width: usize, height: usize) -> Self {
        Self {
            width,
            height,
            pixels: vec![255; width * height * 3],
            text_boxes: Vec::new(),
        }
    }

    fn set(&mut self, x: i64, y: i64, color: [u8; 3]) {
        if x >= 0 && y >= 0 && (x as usize) < self.width && (y as usize) < self.height {
            let i = (y as usize * self.width + x as usize) * 3;
            self.pixels[i..i + 3].copy_from_slice(&color);
        }
    }

    fn rect(&mut self, x0: i64, y0: i64, x1: i64, y1: i64, color: [u8; 3]) {
        for y in y0..=y1 {
            for x in x0..=x1 {
                self.set(x, y, color);
            }
        }
    }

    /// A line `thick` pixels wide.
    fn line(&mut self, (x0, y0): (f64, f64), (x1, y1): (f64, f64), color: [u8; 3], thick: i64) {
        let steps = ((x1 - x0).abs().max((y1 - y0).abs()).ceil() as i64).max(1);
        for i in 0..=steps {
            let t = i as f64 / steps as f64;
            let (x, y) = (
                (x0 + t * (x1 - x0)).round() as i64,
                (y0 + t * (y1 - y0)).round() as i64,
            );
            self.rect(
                x - thick / 2,
                y - thick / 2,
                x + (thick - 1) / 2,
                y + (thick - 1) / 2,
                color,
            );
        }
    }

    /// Text at scale `s` (each glyph is 5s × 7s, advancing 6s).
    fn text(&mut self, x: i64, y: i64, text: &str, s: i64, color: [u8; 3]) {
        self.text_boxes
            .push((x, y, x + Self::text_width(text, s) - 1, y + 7 * s - 1));
        for (k, c) in text.chars().enumerate() {
            let c = c.to_ascii_lowercase();
            let Some((_, rows)) = GLYPHS.iter().find(|(g, _)| *g == c) else {
                continue;
            };
            for (r, bits) in rows.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0x10 >> col) != 0 {
                        let (px, py) = (x + (k as i64 * 6 + col) * s, y + r as i64 * s);
                        self.rect(px, py, px + s - 1, py + s - 1, color);
                    }
                }
            }
        }
    }

    fn text_width(text: &str, s: i64) -> i64 {
        text.chars().count() as i64 * 6 * s
    }
}

/// A "nice" tick step for a range of `span`.
fn tick_step(span: f64) -> f64 {
    let raw = span / 6.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude)
}

/// Draw `series` (accuracy against seconds) with a `title` into a PNG at `path`; `marker`
/// draws a labelled vertical line (e.g. where RL starts). Series with the same label share
/// one legend entry.
pub fn accuracy_plot(
    path: &Path,
    title: &str,
    series: &[Series],
    marker: Option<(f64, &str)>,
) -> std::io::Result<()> {
    fraction_plot(path, title, "held-out accuracy", series, marker)
}

/// [`accuracy_plot`] of any fractions against seconds, the y axis labelled `y_label`.
pub fn fraction_plot(
    path: &Path,
    title: &str,
    y_label: &str,
    series: &[Series],
    marker: Option<(f64, &str)>,
) -> std::io::Result<()> {
    write_png(path, &draw(title, "wall time (s)", y_label, series, marker))
}

/// Fractions in [0, 1] (`y_label`) against any x from 0 (`x_label`), as [`fraction_plot`]
/// draws them against seconds.
pub fn xy_plot(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> std::io::Result<()> {
    write_png(path, &draw(title, x_label, y_label, series, None))
}

fn write_png(path: &Path, c: &Canvas) -> std::io::Result<()> {
    let mut png_bytes = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut png_bytes, c.width as u32, c.height as u32);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().map_err(std::io::Error::other)?;
        writer
            .write_image_data(&c.pixels)
            .map_err(std::io::Error::other)?;
    }
    // Whole or not at all: a run killed while plotting leaves the previous plot.
    crate::atomic::write(path, &png_bytes)
}

/// The title's top edge and the y-axis label's (the label sits on its own line between the
/// title and the plot, so that neither runs into the other).
const TITLE_Y: i64 = 14;
const Y_LABEL_Y: i64 = TITLE_Y + 7 * 3 + 10;

fn draw(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    marker: Option<(f64, &str)>,
) -> Canvas {
    let (w, h) = (900usize, 560usize);
    let (left, right, top, bottom) = (90i64, 30i64, Y_LABEL_Y + 7 * 2 + 18, 70i64);
    let mut c = Canvas::new(w, h);
    let x_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(1.0f64, f64::max)
        * 1.05;
    let (pw, ph) = (
        (w as i64 - left - right) as f64,
        (h as i64 - top - bottom) as f64,
    );
    let px = |x: f64| left as f64 + x / x_max * pw;
    let py = |y: f64| top as f64 + (1.0 - y.clamp(0.0, 1.0)) * ph;
    let grey = [220, 220, 220];
    let ink = [40, 40, 40];
    for i in 0..=5 {
        let y = i as f64 / 5.0;
        c.line((px(0.0), py(y)), (px(x_max), py(y)), grey, 1);
        let label = format!("{y:.1}");
        c.text(
            left - 12 - Canvas::text_width(&label, 2),
            py(y) as i64 - 7,
            &label,
            2,
            ink,
        );
    }
    let step = tick_step(x_max);
    let mut x = 0.0;
    while x <= x_max {
        c.line((px(x), py(0.0)), (px(x), py(1.0)), grey, 1);
        let label = format!("{x:.0}");
        c.text(
            px(x) as i64 - Canvas::text_width(&label, 2) / 2,
            h as i64 - bottom + 10,
            &label,
            2,
            ink,
        );
        x += step;
    }
    c.line((px(0.0), py(0.0)), (px(x_max), py(0.0)), ink, 2);
    c.line((px(0.0), py(0.0)), (px(0.0), py(1.0)), ink, 2);
    if let Some((at, label)) = marker {
        let mut y = 0.0;
        while y < 1.0 {
            c.line(
                (px(at), py(y)),
                (px(at), py((y + 0.02).min(1.0))),
                [150, 150, 150],
                2,
            );
            y += 0.04;
        }
        c.text(px(at) as i64 + 6, top + 4, label, 2, [120, 120, 120]);
    }
    for s in series {
        for pair in s.points.windows(2) {
            c.line(
                (px(pair[0].0), py(pair[0].1)),
                (px(pair[1].0), py(pair[1].1)),
                s.color,
                3,
            );
        }
        for &(x, y) in &s.points {
            c.rect(
                px(x) as i64 - 3,
                py(y) as i64 - 3,
                px(x) as i64 + 3,
                py(y) as i64 + 3,
                s.color,
            );
        }
    }
    c.text(left, TITLE_Y, title, 3, ink);
    c.text(
        left + (pw as i64 - Canvas::text_width(x_label, 2)) / 2,
        h as i64 - 30,
        x_label,
        2,
        ink,
    );
    c.text(8, Y_LABEL_Y, y_label, 2, ink);
    // one legend entry per label (series of several seeds share theirs)
    let mut ly = top + 30;
    let mut shown: Vec<&str> = Vec::new();
    for s in series {
        if shown.contains(&s.label.as_str()) {
            continue;
        }
        shown.push(&s.label);
        c.rect(
            w as i64 - right - 260,
            ly + 4,
            w as i64 - right - 236,
            ly + 8,
            s.color,
        );
        c.text(w as i64 - right - 228, ly, &s.label, 2, ink);
        ly += 22;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The y-axis label once ran into the title.
    #[test]
    fn no_two_labels_overlap() {
        let series = [
            Series {
                label: "warm-up (validation)".into(),
                color: [150, 150, 150],
                points: vec![(0.0, 0.0), (200.0, 0.15)],
            },
            Series {
                label: "held-out (eval)".into(),
                color: [30, 90, 200],
                points: vec![(220.0, 0.14), (330.0, 0.8)],
            },
        ];
        let c = draw(
            "held-out accuracy, greedy",
            "wall time (s)",
            "held-out accuracy",
            &series,
            Some((220.0, "rl")),
        );
        let boxes = &c.text_boxes;
        assert!(boxes.len() > 10, "{boxes:?}");
        for (i, a) in boxes.iter().enumerate() {
            for b in &boxes[i + 1..] {
                let apart = a.2 < b.0 || b.2 < a.0 || a.3 < b.1 || b.3 < a.1;
                assert!(apart, "labels at {a:?} and {b:?} overlap");
            }
        }
    }

    #[test]
    fn writes_a_png_with_the_plotted_points() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("accuracy.png");
        let series = [Series {
            label: "eval".into(),
            color: [30, 90, 200],
            points: vec![(0.0, 0.1), (50.0, 0.5), (100.0, 0.9)],
        }];
        accuracy_plot(&path, "accuracy", &series, Some((20.0, "rl starts"))).unwrap();
        let decoder =
            png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap()));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (900, 560));
        let blue = buf.chunks(3).filter(|p| *p == [30, 90, 200]).count();
        assert!(blue > 500, "the series is drawn ({blue} pixels)");
        assert_eq!(tick_step(105.0), 20.0);
        assert_eq!(tick_step(600.0), 100.0);
    }
}
