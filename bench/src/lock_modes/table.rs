//! The section's two tables: their headers and a line per N.

use super::{Figures, Row};

/// `a ÷ b` with two decimals, `-` when either is missing or `b` is zero.
fn divided(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".to_owned(),
    }
}

fn cell(value: Option<f64>, decimals: usize) -> String {
    value.map_or("failed".to_owned(), |v| format!("{v:.decimals$}"))
}

/// The server's counters of `figures`, one cell each (`columns` of them).
fn server_cells(figures: Option<&Figures>, columns: usize) -> Vec<String> {
    (0..columns)
        .map(|i| cell(figures.and_then(|f| f.server.get(i).copied()), 2))
        .collect()
}

/// The first table's line for `row`: mutex and EX side by side, then
/// `counters` columns of server counters per grant (mutex / EX).
pub fn ex_line(row: &Row, counters: usize) -> String {
    let (mutex, ex) = (row.mutex.as_ref().ok(), row.ex.as_ref().ok());
    let grants = (mutex.map(Figures::grants_per_sec), ex.map(Figures::grants_per_sec));
    let contended = row.n > 1;
    let handoffs = (
        mutex.filter(|_| contended).map(Figures::handoffs_per_sec),
        ex.filter(|_| contended).map(Figures::handoffs_per_sec),
    );
    let dash_or = |value: Option<f64>, failed: bool| {
        if contended {
            cell(value, 0)
        } else if failed {
            "failed".to_owned()
        } else {
            "-".to_owned()
        }
    };
    let latency = |figures: Option<&Figures>| {
        figures.map_or("failed".to_owned(), |f| {
            if contended {
                f.outcome.handoff.p50_p99()
            } else {
                f.outcome.acquire.p50_p99()
            }
        })
    };
    let server: String = server_cells(mutex, counters)
        .into_iter()
        .zip(server_cells(ex, counters))
        .map(|(m, e)| format!(" {m} / {e} |"))
        .collect();
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} |{server}",
        row.n,
        if row.ex_first { "EX" } else { "mutex" },
        cell(grants.0, 0),
        cell(grants.1, 0),
        divided(grants.1, grants.0),
        dash_or(handoffs.0, mutex.is_none()),
        dash_or(handoffs.1, ex.is_none()),
        divided(handoffs.1, handoffs.0),
        latency(mutex),
        latency(ex),
        cell(mutex.map(|f| f.wakeups_per_release), 2),
        cell(ex.map(|f| f.wakeups_per_release), 2),
    )
}

/// The second table's line for `row`: the mixed workload, then `counters`
/// columns of server counters per grant.
pub fn mixed_line(row: &Row, counters: usize) -> String {
    let mutex = row.mutex.as_ref().ok().map(Figures::grants_per_sec);
    let server: String = server_cells(row.mixed.as_ref().ok(), counters)
        .into_iter()
        .map(|c| format!(" {c} |"))
        .collect();
    match &row.mixed {
        Ok(mixed) => format!(
            "| {} | {:.0} | {} | {:.0} | {} | {} | {:.2} | {} |{server}",
            row.n,
            mixed.grants_per_sec(),
            divided(Some(mixed.grants_per_sec()), mutex),
            mixed.per_sec(mixed.conversions),
            mixed.deadlocks,
            mixed.outcome.acquire.p50_p99(),
            mixed.wakeups_per_release,
            mixed.overlaps,
        ),
        Err(_) => format!("| {} | failed | - | - | - | - | - | - |{server}", row.n),
    }
}

/// The first table's header and its rule, with a column per name of
/// `counters` (server counters per grant).
pub fn ex_header(counters: &[String]) -> String {
    let extra: String = counters.iter().map(|c| format!(" {c}/grant: mutex / EX |")).collect();
    format!(
        "| N | first | grants/s: mutex | EX | EX ÷ mutex | handoffs/s: mutex | EX | EX ÷ mutex | \
         handoff p50 / p99 (ms; N = 1: acquire): mutex | EX | wakeups/release: mutex / EX |{extra}\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|{}",
        "---:|".repeat(counters.len())
    )
}

/// The second table's header and its rule, with a column per name of
/// `counters`.
pub fn mixed_header(counters: &[String]) -> String {
    let extra: String = counters.iter().map(|c| format!(" {c}/grant |")).collect();
    format!(
        "| N | grants/s | mixed ÷ mutex (grants/s) | conversions/s | up-conversions refused as deadlocks | \
         acquire p50 / p99 (ms) | wakeups/release | incompatible holds seen |{extra}\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|{}",
        "---:|".repeat(counters.len())
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contest::Outcome;

    fn figures(grants: u64, handoffs: u64) -> Figures {
        Figures {
            outcome: Outcome {
                grants,
                handoffs,
                seconds: 2.0,
                ..Outcome::default()
            },
            wakeups_per_release: 1.0,
            ..Figures::default()
        }
    }

    #[test]
    fn lines_show_ratios_and_failures() {
        let row = Row {
            n: 4,
            ex_first: true,
            mutex: Ok(figures(2000, 1998)),
            ex: Ok(figures(1000, 999)),
            mixed: Err("stalled".into()),
        };
        assert_eq!(
            ex_line(&row, 0),
            "| 4 | EX | 1000 | 500 | 0.50 | 999 | 500 | 0.50 | - | - | 1.00 / 1.00 |"
        );
        assert_eq!(mixed_line(&row, 0), "| 4 | failed | - | - | - | - | - | - |");
        assert_eq!(mixed_line(&row, 1), "| 4 | failed | - | - | - | - | - | - | failed |");
        let row = Row {
            n: 1,
            ex_first: false,
            mutex: Err("gone".into()),
            ex: Ok(figures(100, 0)),
            mixed: Ok(Figures {
                conversions: 20,
                deadlocks: 3,
                ..figures(300, 0)
            }),
        };
        assert_eq!(
            ex_line(&row, 0),
            "| 1 | mutex | failed | 50 | - | failed | - | - | failed | - | failed / 1.00 |"
        );
        assert_eq!(mixed_line(&row, 0), "| 1 | 150 | - | 10 | 3 | - | 1.00 | 0 |");
        let row = Row {
            ex: Ok(Figures {
                server: vec![2.0, 0.5],
                ..figures(100, 0)
            }),
            ..row
        };
        assert_eq!(
            ex_line(&row, 2),
            "| 1 | mutex | failed | 50 | - | failed | - | - | failed | - | failed / 1.00 | failed / 2.00 | failed / 0.50 |"
        );
        let header = ex_header(&["flushes".to_owned()]);
        let (names, rule) = header.split_once('\n').expect("two lines");
        assert!(names.ends_with("| flushes/grant: mutex / EX |"), "{names}");
        assert_eq!(names.matches('|').count(), rule.matches('|').count());
        let header = mixed_header(&["flushes".to_owned(), "statements".to_owned()]);
        let (names, rule) = header.split_once('\n').expect("two lines");
        assert!(names.ends_with("| flushes/grant | statements/grant |"), "{names}");
        assert_eq!(names.matches('|').count(), rule.matches('|').count());
    }
}
