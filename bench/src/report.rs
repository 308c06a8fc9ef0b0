//! The figures' shared wording: ratios, verdicts, and the latency target
//! line.

use crate::latency::{ms, Latencies};

/// `a / b` with one decimal; `∞` when only `b` is zero, `-` when both are.
pub fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.1}", a / b)
    } else if a > 0.0 {
        "∞".to_owned()
    } else {
        "-".to_owned()
    }
}

/// `met` or `missed`.
pub fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "missed"
    }
}

/// `latencies`' p99 over `base_ms` with two decimals, `-` without samples.
pub fn p99_over(latencies: &Latencies, base_ms: f64) -> String {
    latencies
        .quantile(0.99)
        .map_or("-".to_owned(), |p99| format!("{:.2}", ms(p99) / base_ms))
}

/// The line of the target "p99 handoff ≤ 3 × p50 B_write latency", at the
/// largest N with handoffs (`rows` in the order measured: N and its
/// handoff latencies); `None` when no N has any.
pub fn p99_target_line<'a>(
    rows: impl DoubleEndedIterator<Item = (usize, &'a Latencies)>,
    b_write_p50: f64,
) -> Option<String> {
    let (n, handoff) = rows.rev().find(|(_, handoff)| !handoff.is_empty())?;
    let p99 = handoff.quantile(0.99).map(ms).unwrap_or(f64::NAN);
    let ratio = p99 / b_write_p50;
    Some(format!(
        "target p99 handoff ≤ 3 × p50 B_write latency at N = {n}: {p99:.2} ms / {b_write_p50:.2} ms = {ratio:.2} ({})",
        verdict(ratio <= 3.0)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn ratios_and_lines() {
        assert_eq!(ratio(3.0, 2.0), "1.5");
        assert_eq!(ratio(3.0, 0.0), "∞");
        assert_eq!(ratio(0.0, 0.0), "-");
        let mut handoff = Latencies::new();
        assert_eq!(p99_over(&handoff, 1.0), "-");
        handoff.push(Duration::from_millis(2));
        assert_eq!(p99_over(&handoff, 0.5), "4.00");
        let empty = Latencies::new();
        let rows = [(2, &handoff), (4, &empty)];
        assert_eq!(
            p99_target_line(rows.iter().copied(), 0.5).as_deref(),
            Some("target p99 handoff ≤ 3 × p50 B_write latency at N = 2: 2.00 ms / 0.50 ms = 4.00 (missed)")
        );
        assert_eq!(p99_target_line([(1, &empty)].into_iter(), 0.5), None);
    }
}
