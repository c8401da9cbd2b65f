//! Pictures for the reports, as SVG files (plotters' SVG backend: text is left to the
//! viewer's fonts, so nothing here needs a font on this machine): lines against size for the
//! micro-benchmarks and the collectives (the OSU paper's Figs. 2–5), and stacked bars of
//! phases for the workloads (HP's Figs. 2 and 3).

use std::path::Path;

use plotters::prelude::*;

use crate::EvalError;

/// Width and height of every picture, in pixels.
const SIZE: (u32, u32) = (760, 440);
/// Series drawn in one picture at most (the palette's length; more would repeat colours).
pub const SERIES_MAX: usize = 10;
/// Bars in one picture at most.
pub const BARS_MAX: usize = 40;

const PALETTE: [RGBColor; SERIES_MAX] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Ticks on a size axis at most.
const SIZE_TICKS_MAX: usize = 8;

/// A size as people write it: `8 B`, `4 KiB`, `1 MiB`, `1.5 GiB`.
pub fn size_label(bytes: f64) -> String {
    let units = [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    let (div, unit) = units.into_iter().find(|(d, _)| bytes >= *d as f64).unwrap_or((1, "B"));
    number_label(bytes / div as f64) + " " + unit
}

/// A number without trailing zeros: `1000`, `2.5`, `0.25`, `0.0031`.
pub fn number_label(v: f64) -> String {
    let digits = if v.abs() >= 100.0 || v == v.trunc() {
        0
    } else if v.abs() >= 1.0 {
        1
    } else {
        (-v.abs().log10().floor()) as usize + 1
    };
    format!("{v:.digits$}")
}

/// The sizes to mark on a size axis from `x0` to `x1`: powers of two, at most
/// [`SIZE_TICKS_MAX`] of them, evenly spaced.
fn size_ticks(x0: f64, x1: f64) -> Vec<f64> {
    let (lo, hi) = (x0.max(1.0).log2().ceil() as i32, x1.max(1.0).log2().floor() as i32);
    let all: Vec<i32> = (lo..=hi).collect();
    let step = all.len().div_ceil(SIZE_TICKS_MAX).max(1);
    all.iter().step_by(step).map(|k| 2f64.powi(*k)).collect()
}

/// One line of a line chart: its name and its points (x, y), x ascending.
#[derive(Clone, Debug)]
pub struct Series {
    /// Its name in the legend.
    pub name: String,
    /// Its points.
    pub points: Vec<(f64, f64)>,
}

fn draw_err(e: impl std::fmt::Display) -> EvalError {
    EvalError::Io(format!("drawing: {e}"))
}

/// A line chart of `series` against a logarithmic x axis (sizes), the y axis logarithmic when
/// `log_y`, written to `path` as SVG.
pub fn lines(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    log_y: bool,
    series: &[Series],
) -> Result<(), EvalError> {
    if series.len() > SERIES_MAX {
        return Err(EvalError::BadArgument(format!("{} series in one chart: at most {SERIES_MAX}", series.len())));
    }
    let pts = || series.iter().flat_map(|s| s.points.iter().copied()).filter(|(x, y)| *x > 0.0 && *y > 0.0);
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in pts() {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        return Err(EvalError::BadArgument(format!("{title}: nothing to draw")));
    }
    let (x0, x1) = (x0 / 1.5, x1 * 1.5);
    let (y0, y1) = if log_y { (y0 / 1.5, y1 * 1.5) } else { (0.0, y1 * 1.1) };
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let mut b = ChartBuilder::on(&root);
    b.caption(title, ("sans-serif", 18)).margin(12).x_label_area_size(40).y_label_area_size(60);
    // The two y scales are different types: one drawing routine for each.
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc(y_desc)
                .x_label_formatter(&|x| size_label(*x))
                .y_label_formatter(&|y| number_label(*y))
                .draw()
                .map_err(draw_err)?;
            for (i, s) in series.iter().enumerate() {
                let colour = PALETTE[i];
                let points: Vec<(f64, f64)> = s.points.iter().copied().filter(|(x, y)| *x > 0.0 && *y > 0.0).collect();
                chart
                    .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
                    .map_err(draw_err)?
                    .label(s.name.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2)));
                chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, colour.filled()))).map_err(draw_err)?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(draw_err)?;
        }};
    }
    // Sizes marked where people look for them (8 B, 1 KiB, 1 MiB), not at powers of ten.
    let ticks = size_ticks(x0, x1);
    if log_y {
        draw!(b
            .build_cartesian_2d((x0..x1).log_scale().with_key_points(ticks), (y0..y1).log_scale())
            .map_err(draw_err)?);
    } else {
        draw!(b.build_cartesian_2d((x0..x1).log_scale().with_key_points(ticks), y0..y1).map_err(draw_err)?);
    }
    root.present().map_err(draw_err)
}

/// One bar of a stacked bar chart: its label and its parts (name, value), stacked in order.
#[derive(Clone, Debug)]
pub struct Bar {
    /// Its label under the axis.
    pub label: String,
    /// Its parts.
    pub parts: Vec<(String, f64)>,
}

/// A stacked bar chart (each bar's parts stacked bottom up, one colour per part name),
/// written to `path` as SVG.
pub fn stacked_bars(path: &Path, title: &str, y_desc: &str, bars: &[Bar]) -> Result<(), EvalError> {
    if bars.is_empty() || bars.len() > BARS_MAX {
        return Err(EvalError::BadArgument(format!("{} bars in one chart: 1..={BARS_MAX}", bars.len())));
    }
    let mut names: Vec<&str> = Vec::new();
    for b in bars {
        for (n, _) in &b.parts {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
    }
    if names.len() > SERIES_MAX {
        return Err(EvalError::BadArgument(format!("{} parts: at most {SERIES_MAX}", names.len())));
    }
    let top = bars.iter().map(|b| b.parts.iter().map(|(_, v)| v.max(0.0)).sum::<f64>()).fold(0.0, f64::max);
    let top = if top > 0.0 { top * 1.15 } else { 1.0 };
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let n = bars.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(60)
        .y_label_area_size(60)
        .build_cartesian_2d((0..n - 1).into_segmented(), 0f64..top)
        .map_err(draw_err)?;
    let labels: Vec<String> = bars.iter().map(|b| b.label.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n + 1)
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc(y_desc)
        .draw()
        .map_err(draw_err)?;
    for (k, name) in names.iter().enumerate() {
        let colour = PALETTE[k];
        let rects: Vec<Rectangle<(SegmentValue<usize>, f64)>> = bars
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                let below: f64 = b.parts.iter().take_while(|(n, _)| n != name).map(|(_, v)| v.max(0.0)).sum();
                let v = b.parts.iter().find(|(n, _)| n == name)?.1.max(0.0);
                let mut r = Rectangle::new(
                    [(SegmentValue::Exact(i), below), (SegmentValue::Exact(i + 1), below + v)],
                    colour.filled(),
                );
                r.set_margin(0, 0, 8, 8);
                Some(r)
            })
            .collect();
        chart
            .draw_series(rects)
            .map_err(draw_err)?
            .label(name.to_string())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(draw_err)?;
    root.present().map_err(draw_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A written picture is one well-formed SVG document naming what it was given.
    fn check_svg(path: &Path, names: &[&str]) {
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"), "{}", &text[..80.min(text.len())]);
        assert_eq!(text.matches("<svg").count(), 1);
        for n in names {
            assert!(text.contains(n), "{n} missing from {}", path.display());
        }
    }

    // Checks the axis labels: sizes in B, KiB, MiB and GiB with no trailing zeros; plain numbers
    // to the digits that matter; size ticks at powers of two, at most SIZE_TICKS_MAX.
    #[test]
    fn sizes_and_numbers_are_labelled_as_people_write_them() {
        assert_eq!(size_label(8.0), "8 B");
        assert_eq!(size_label(1024.0), "1 KiB");
        assert_eq!(size_label(65536.0), "64 KiB");
        assert_eq!(size_label(1048576.0), "1 MiB");
        assert_eq!(size_label(1.5 * 1073741824.0), "1.5 GiB");
        assert_eq!(number_label(1000.0), "1000");
        assert_eq!(number_label(2.5), "2.5");
        assert_eq!(number_label(0.25), "0.25");
        assert_eq!(number_label(0.0031), "0.0031");
        let t = size_ticks(5.0, 1.6e6);
        assert!(t.len() <= SIZE_TICKS_MAX && t[0] == 8.0, "{t:?}");
        assert!(t.iter().all(|x| x.log2().fract() == 0.0 && (5.0..=1.6e6).contains(x)), "{t:?}");
    }

    // Checks both kinds of picture: written, well-formed, with the title and every series
    // or part named; and that empty or oversized inputs are refused, not drawn.
    #[test]
    fn pictures_are_valid_svg() {
        let dir = std::env::temp_dir().join(format!("rackwire-plot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = |name: &str, k: f64| Series {
            name: name.into(),
            points: vec![(8.0, k), (4096.0, 2.0 * k), (1048576.0, 9.0 * k)],
        };
        let p = dir.join("lat.svg");
        lines(&p, "latency", "bytes", "µs", true, &[s("shm", 0.2), s("ucx-posix", 0.3)]).unwrap();
        // Sizes marked as people write them (each label a text element of its own line).
        check_svg(&p, &["latency", "shm", "ucx-posix", "\n8 B\n", "\n4 KiB\n"]);
        let p = dir.join("bw.svg");
        lines(&p, "bandwidth", "bytes", "MB/s", false, &[s("shm", 10.0)]).unwrap();
        check_svg(&p, &["bandwidth", "shm"]);
        let bar = |l: &str| Bar { label: l.into(), parts: vec![("shuffle".into(), 1.0), ("sort".into(), 0.5)] };
        let p = dir.join("phases.svg");
        stacked_bars(&p, "sort phases", "s", &[bar("fabric"), bar("tcp")]).unwrap();
        check_svg(&p, &["sort phases", "shuffle", "sort", "fabric", "tcp"]);
        assert!(stacked_bars(&dir.join("x.svg"), "none", "s", &[]).is_err());
        assert!(lines(&dir.join("y.svg"), "none", "b", "s", true, &[]).is_err());
        let many: Vec<Series> = (0..SERIES_MAX + 1).map(|i| s(&i.to_string(), 1.0)).collect();
        assert!(lines(&dir.join("z.svg"), "many", "b", "s", true, &many).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
