//! The twin's report as a table for people (the JSON form is the
//! [`Report`] serialized).

use std::fmt::Write;

use super::Report;

/// The report as text.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let r = &report.requests;
    let _ = writeln!(
        out,
        "SavedModel   {} (model '{}' version {}, signature '{}')",
        report.saved_model, report.model, report.version, report.signature
    );
    let _ = writeln!(out, "twin         {}", report.converter);
    let _ = writeln!(
        out,
        "requests     {} from the warmup file, {} logged (of {} in the log), {} synthetic{}{}",
        r.warmup,
        r.logged,
        r.logged_read,
        r.synthetic,
        if r.other_signatures > 0 {
            format!("; {} of them for other signatures", r.other_signatures)
        } else {
            String::new()
        },
        if r.failed_in_saved_model > 0 {
            format!("; {} the SavedModel failed, not compared", r.failed_in_saved_model)
        } else {
            String::new()
        }
    );
    if report.signature_differences.is_empty() {
        let _ = writeln!(out, "signature    the same names, dtypes and shapes");
    } else {
        for difference in &report.signature_differences {
            let _ = writeln!(out, "signature    {difference}");
        }
    }
    if !report.twinned_signatures.is_empty() {
        let _ = writeln!(out, "also twinned signatures {}", report.twinned_signatures.join(", "));
    }
    for not in &report.not_twinned {
        let _ = writeln!(out, "not twinned  signature {not}");
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<20} {:<12} {:>8} {:>6} {:>9} {:>10} {:>10}",
        "output", "dtype", "rows", "over", "share", "max abs", "max rel"
    );
    for o in &report.outputs {
        let number = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.3e}"));
        let _ = writeln!(
            out,
            "{:<20} {:<12} {:>8} {:>6} {:>8.3}% {:>10} {:>10}",
            if o.signature == report.signature { o.output.clone() } else { format!("{}: {}", o.signature, o.output) },
            o.dtype,
            o.rows,
            o.rows_over,
            o.share_over() * 100.0,
            number(o.max_abs),
            number(o.max_rel)
        );
    }
    if !report.cost.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "{:<26} {:>14} {:>14} {:>12}", "CPU per request", "SavedModel", "twin", "twin/saved");
        for row in &report.cost {
            let _ = writeln!(
                out,
                "{:<26} {:>11.1} µs {:>11.1} µs {:>11.2}×",
                format!("batch {}", row.batch),
                row.saved_model.cpu_us_per_request,
                row.twin.cpu_us_per_request,
                row.cpu_ratio
            );
        }
    }
    if let Some(error) = &report.cost_error {
        let _ = writeln!(out, "\nCPU          not measured: {error}");
    }
    let _ = writeln!(out);
    if report.problems.is_empty() {
        let _ = writeln!(
            out,
            "verified     every output within rtol {}, atol {}",
            report.tolerance.rtol, report.tolerance.atol
        );
    } else {
        for problem in &report.problems {
            let _ = writeln!(out, "NOT VERIFIED {problem}");
        }
    }
    if let Some(published) = &report.published {
        let _ = writeln!(out, "published    {published} (model.onnx, assets.extra/)");
    }
    out.trim_end().to_string()
}
