//! Charts of the benchmarks' distributions, as SVG (plotters), for docs/benchmarks.md.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;

/// Debian's `fonts-dejavu-core` (installed by `scripts/setup.sh`): plotters draws text with a
/// font it is given.
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let bytes = std::fs::read(FONT).unwrap_or_else(|e| panic!("{FONT}: {e}"));
        plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(bytes.into()))
            .unwrap_or_else(|_| panic!("{FONT} is not a font plotters can use"));
    });
}

/// The cumulative distribution of each series (a label's number and its samples in ms, sorted),
/// on a log-scaled time axis.
pub fn cdf(path: &Path, title: &str, x_label: &str, series: &[(usize, Vec<f64>)]) {
    register_font();
    let most = series
        .iter()
        .filter_map(|(_, s)| s.last())
        .copied()
        .fold(1.0, f64::max);
    let least = series
        .iter()
        .filter_map(|(_, s)| s.first())
        .copied()
        .fold(most, f64::min)
        .max(0.01);
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE).unwrap();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((least * 0.9..most * 1.1).log_scale(), 0.0..1.0)
        .unwrap();
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("fraction of changes")
        .draw()
        .unwrap();
    for (i, (n, samples)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let len = samples.len() as f64;
        chart
            .draw_series(LineSeries::new(
                samples
                    .iter()
                    .enumerate()
                    .map(|(k, ms)| (*ms, (k + 1) as f64 / len)),
                color.stroke_width(2),
            ))
            .unwrap()
            .label(format!("{n} instance{}", if *n == 1 { "" } else { "s" }))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight);
    root.present().unwrap();
}

/// One line per series (its label and `(x, y)` points), both axes log-scaled.
pub fn lines(
    path: &Path,
    title: &str,
    (x_label, y_label): (&str, &str),
    series: &[(String, Vec<(f64, f64)>)],
) {
    register_font();
    let points = || series.iter().flat_map(|(_, p)| p.iter().copied());
    let bounds = |f: fn((f64, f64)) -> f64| {
        let (lo, hi) = points()
            .map(f)
            .fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
        (lo.max(0.01) * 0.8)..(hi.max(lo) * 1.25)
    };
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE).unwrap();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(bounds(|p| p.0).log_scale(), bounds(|p| p.1).log_scale())
        .unwrap();
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .draw()
        .unwrap();
    for (i, (label, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .unwrap()
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
        chart
            .draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .unwrap();
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft);
    root.present().unwrap();
}

/// Each series' label, boxed, at `position`.
fn legend<'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    position: SeriesLabelPosition,
) {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .unwrap();
}
