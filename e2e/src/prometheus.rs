//! Reading the Prometheus exporter's text, as a scrape would.

/// The value of `series` (a name, with its labels) in the exporter's text.
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{series} is not in the exporter's text:\n{text}"))
}
