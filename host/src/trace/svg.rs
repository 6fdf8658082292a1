//! A small SVG line-plot writer: log-2 x axis (batch sizes), linear y axis from 0, one
//! polyline per series, a legend.

use std::fmt::Write;

/// One named line.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// The legend's label.
    pub name: String,
    /// (x, y) points, drawn in this order; those with no place on the axes (x ≤ 0 on the
    /// log axis, or not finite) are left out.
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// The points that have a place on the axes.
    fn drawn(&self) -> impl Iterator<Item = &(f64, f64)> {
        self.points.iter().filter(|(x, y)| *x > 0.0 && x.is_finite() && y.is_finite())
    }
}

/// A line plot.
#[derive(Clone, Debug, PartialEq)]
pub struct Plot {
    /// Above the plot.
    pub title: String,
    /// Under the x axis (log 2).
    pub x_label: String,
    /// Beside the y axis (linear, from 0).
    pub y_label: String,
    /// The lines, drawn in order, each in the next of four colours.
    pub series: Vec<Series>,
}

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 400.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 620.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 340.0;
const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
const Y_TICKS: u32 = 5;
const MIDDLE: &str = "text-anchor=\"middle\"";

impl Plot {
    /// The plot as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        let points = || self.series.iter().flat_map(Series::drawn);
        let log_xs = || points().map(|&(x, _)| x.log2());
        let x_lo = log_xs().fold(f64::INFINITY, f64::min).floor();
        let x_hi = log_xs().fold(f64::NEG_INFINITY, f64::max).ceil();
        let (x_lo, x_hi) = match (x_lo < x_hi, x_lo.is_finite()) {
            (true, _) => (x_lo, x_hi),
            (false, true) => (x_lo, x_lo + 1.0), // one batch size: one octave
            (false, false) => (0.0, 1.0),        // no points
        };
        let y_hi = nice_ceiling(points().map(|&(_, y)| y).fold(0.0, f64::max));
        let px = |x: f64| LEFT + (x.log2() - x_lo) / (x_hi - x_lo) * (RIGHT - LEFT);
        let py = |y: f64| BOTTOM - y / y_hi * (BOTTOM - TOP);

        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
             viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"sans-serif\" font-size=\"12\">\n\
             <rect width=\"{WIDTH}\" height=\"{HEIGHT}\" fill=\"white\"/>\n\
             <path d=\"M{LEFT},{TOP} V{BOTTOM} H{RIGHT}\" fill=\"none\" stroke=\"black\"/>\n"
        );
        let (mid_x, mid_y) = ((LEFT + RIGHT) / 2.0, (TOP + BOTTOM) / 2.0);
        svg += &text((mid_x, 24.0), "text-anchor=\"middle\" font-size=\"15\"", &self.title);
        svg += &text((mid_x, HEIGHT - 20.0), MIDDLE, &self.x_label);
        svg += &text((20.0, mid_y), &format!("{MIDDLE} transform=\"rotate(-90 20 {mid_y})\""), &self.y_label);
        for k in x_lo as i32..=x_hi as i32 {
            let x = px(2f64.powi(k));
            svg += &line((x, BOTTOM), (x, BOTTOM + 5.0), "black");
            svg += &text((x, BOTTOM + 20.0), MIDDLE, &tick(2f64.powi(k)));
        }
        for i in 0..=Y_TICKS {
            let value = y_hi * f64::from(i) / f64::from(Y_TICKS);
            let y = py(value);
            svg += &line((LEFT - 5.0, y), (LEFT, y), "black");
            svg += &text((LEFT - 8.0, y + 4.0), "text-anchor=\"end\"", &tick(value));
        }
        for (i, (series, color)) in self.series.iter().zip(COLORS.iter().cycle()).enumerate() {
            let coords: Vec<String> = series.drawn().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
            let points = coords.join(" ");
            let _ = writeln!(svg, "<polyline points=\"{points}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"/>");
            let y = TOP + 15.0 + 18.0 * i as f64;
            svg += &line((LEFT + 15.0, y), (LEFT + 40.0, y), color);
            svg += &text((LEFT + 46.0, y + 4.0), "", &series.name);
        }
        svg + "</svg>\n"
    }
}

fn line((x1, y1): (f64, f64), (x2, y2): (f64, f64), color: &str) -> String {
    format!("<line x1=\"{x1}\" y1=\"{y1}\" x2=\"{x2}\" y2=\"{y2}\" stroke=\"{color}\" stroke-width=\"2\"/>\n")
}

/// `content`, escaped, at (x, y) with extra attributes.
fn text((x, y): (f64, f64), attributes: &str, content: &str) -> String {
    format!("<text x=\"{x}\" y=\"{y}\" {attributes}>{}</text>\n", escape(content))
}

/// The least 1, 2 or 5 × 10ᵏ at or above `max` (1 for `max` ≤ 0).
fn nice_ceiling(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let decade = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * decade).find(|&v| v >= max).unwrap_or(10.0 * decade)
}

/// A tick label: at most 3 decimals, trailing zeros dropped.
fn tick(value: f64) -> String {
    let text = format!("{value:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plot() -> Plot {
        Plot {
            title: "TKLQT & idle".into(),
            x_label: "batch".into(),
            y_label: "µs".into(),
            series: vec![
                Series { name: "a".into(), points: vec![(1.0, 0.0), (4.0, 7.0)] },
                Series { name: "b<c".into(), points: vec![(1.0, 3.0), (2.0, 1.5), (4.0, 2.0)] },
            ],
        }
    }

    #[test]
    fn draws_one_polyline_per_series_on_log2_and_linear_axes() {
        let svg = plot().to_svg();
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\"") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        // x 1..4 spans 80..620 (2 at the middle, 350); y 0..10 (7 rounds up to 10) spans 340..40.
        assert!(svg.contains("points=\"80.0,340.0 620.0,130.0\""), "{svg}");
        assert!(svg.contains("points=\"80.0,250.0 350.0,295.0 620.0,280.0\""), "{svg}");
        for label in [">1</text>", ">2</text>", ">4</text>", ">0</text>", ">10</text>", ">a</text>"] {
            assert!(svg.contains(label), "missing {label}");
        }
        assert!(svg.contains(">TKLQT &amp; idle<") && svg.contains(">b&lt;c<"), "text is escaped");
    }

    #[test]
    fn rounds_the_y_axis_up_to_1_2_or_5() {
        let ceilings: Vec<f64> = [0.0, 0.3, 1.0, 1.01, 3.0, 7.0, 420.0].into_iter().map(nice_ceiling).collect();
        assert_eq!(ceilings, [1.0, 0.5, 1.0, 2.0, 5.0, 10.0, 500.0]);
        assert_eq!((tick(0.25), tick(12.0), tick(0.1 + 0.2)), ("0.25".into(), "12".into(), "0.3".into()));
    }

    #[test]
    fn a_single_batch_or_none_gets_a_one_octave_axis() {
        let one = Plot { series: vec![Series { name: "a".into(), points: vec![(8.0, 1.0)] }], ..plot() };
        let svg = one.to_svg();
        assert!(svg.contains(">8</text>") && svg.contains(">16</text>"), "{svg}");
        assert!(svg.contains("points=\"80.0,40.0\""), "{svg}");
        let empty = Plot { series: vec![Series { name: "a".into(), points: vec![] }], ..plot() }.to_svg();
        assert!(empty.contains(">1</text>") && empty.contains(">2</text>") && empty.contains("points=\"\""), "{empty}");
    }

    #[test]
    fn points_off_the_log_axis_are_left_out() {
        // A trace with no batch size sweeps as batch 0: log2(0) = -inf once spanned 2^31 ticks.
        let points = vec![(0.0, 3.0), (4.0, 1.0), (f64::NAN, 2.0), (8.0, f64::INFINITY), (8.0, 2.0)];
        let svg = Plot { series: vec![Series { name: "a".into(), points }], ..plot() }.to_svg();
        assert!(svg.len() < 10_000 && svg.contains(">4</text>") && svg.contains(">8</text>"), "{svg}");
        let line = svg.split("<polyline points=\"").nth(1).and_then(|rest| rest.split('"').next());
        assert_eq!(line.map(|coords| coords.split(' ').count()), Some(2), "{svg}");
    }
}
