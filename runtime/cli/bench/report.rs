//! The HTML report of a step run: throughput against latency, as one
//! self-contained page (an inline SVG chart and a table; no scripts, no
//! network).

use std::fmt::Write;

use super::stats::Summary;

/// One step of a step run: the rate asked for and what was measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Step {
    /// Requests per second offered.
    pub offered_rps: f64,
    /// What the step measured.
    pub summary: Summary,
    /// Whether the step stayed within the error and p99 limits.
    pub within_limits: bool,
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The page for `steps` of a run described by `title`.
pub fn html(title: &str, steps: &[Step], p99_limit_ms: Option<f64>) -> String {
    const W: f64 = 720.0;
    const H: f64 = 400.0;
    const PAD: f64 = 60.0;
    let max_x = steps.iter().map(|s| s.summary.requests_per_second).fold(1.0, f64::max) * 1.05;
    let max_y = steps.iter().map(|s| s.summary.p99_ms).chain(p99_limit_ms).fold(1e-3, f64::max) * 1.1;
    let x = |v: f64| PAD + v / max_x * (W - 2.0 * PAD);
    let y = |v: f64| H - PAD - v / max_y * (H - 2.0 * PAD);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(
        svg,
        r#"<line x1="{PAD}" y1="{b}" x2="{r}" y2="{b}" stroke="black"/><line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{b}" stroke="black"/>"#,
        b = H - PAD,
        r = W - PAD
    );
    for i in 0..=5 {
        let (vx, vy) = (max_x * i as f64 / 5.0, max_y * i as f64 / 5.0);
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{vx:.0}</text><text x="{:.1}" y="{:.1}" text-anchor="end">{vy:.2}</text>"#,
            x(vx),
            H - PAD + 18.0,
            PAD - 6.0,
            y(vy) + 4.0
        );
    }
    let _ = write!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">throughput (req/s)</text><text x="16" y="{:.1}" transform="rotate(-90 16 {:.1})" text-anchor="middle">latency (ms)</text>"#,
        W / 2.0,
        H - 12.0,
        H / 2.0,
        H / 2.0
    );
    if let Some(limit) = p99_limit_ms {
        let _ = write!(
            svg,
            r##"<line x1="{PAD}" y1="{ly:.1}" x2="{r}" y2="{ly:.1}" stroke="#c00" stroke-dasharray="4 4"/><text x="{r}" y="{:.1}" text-anchor="end" fill="#c00">p99 limit</text>"##,
            y(limit) - 4.0,
            ly = y(limit),
            r = W - PAD
        );
    }
    for (name, color, pick) in [
        ("p50", "#1f77b4", (|s: &Summary| s.p50_ms) as fn(&Summary) -> f64),
        ("p99", "#ff7f0e", |s: &Summary| s.p99_ms),
    ] {
        let points: Vec<String> = steps
            .iter()
            .map(|s| format!("{:.1},{:.1}", x(s.summary.requests_per_second), y(pick(&s.summary))))
            .collect();
        let _ =
            write!(svg, r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#, points.join(" "));
        for s in steps {
            let _ = write!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"><title>{name} {:.3} ms at {:.1} req/s</title></circle>"#,
                x(s.summary.requests_per_second),
                y(pick(&s.summary)),
                pick(&s.summary),
                s.summary.requests_per_second
            );
        }
        let legend_y = if name == "p50" { PAD } else { PAD + 16.0 };
        let _ = write!(svg, r#"<text x="{:.1}" y="{legend_y:.1}" fill="{color}">{name}</text>"#, W - PAD - 30.0);
    }
    svg.push_str("</svg>");

    let mut rows = String::new();
    for s in steps {
        let m = &s.summary;
        let _ = write!(
            rows,
            "<tr><td>{:.1}</td><td>{:.1}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td><td>{:.2}%</td><td>{}</td></tr>",
            s.offered_rps,
            m.requests_per_second,
            m.p50_ms,
            m.p99_ms,
            m.p999_ms,
            m.error_rate * 100.0,
            if s.within_limits { "yes" } else { "no" }
        );
    }
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}</style>\
         </head><body><h1>{t}</h1>{svg}<table><tr><th>offered req/s</th><th>achieved req/s</th><th>p50 ms</th><th>p99 ms</th><th>p99.9 ms</th><th>errors</th><th>within limits</th></tr>{rows}</table></body></html>",
        t = escape(title)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::bench::stats::Recorder;
    use std::time::Duration;

    #[test]
    fn the_page_has_a_chart_and_a_row_per_step() {
        let mut r = Recorder::default();
        r.ok(Duration::from_millis(2), 1);
        let summary = r.summary(Duration::from_secs(1));
        let steps = vec![
            Step { offered_rps: 100.0, summary: summary.clone(), within_limits: true },
            Step { offered_rps: 125.0, summary, within_limits: false },
        ];
        let page = html("mlp <step>", &steps, Some(10.0));
        assert!(page.contains("<svg"));
        assert!(page.contains("mlp &lt;step&gt;"));
        assert_eq!(page.matches("<tr><td>").count(), 2);
        assert!(page.contains("p99 limit"));
    }
}
