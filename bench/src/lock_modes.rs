//! The lock modes beside the mutex, on any backend: for each N, lockline's
//! mutex, a [`Resource`] locked in EX, and a mixed workload of the six
//! modes, measured one after the other in the same run against the same
//! server ([`run`]).
//!
//! - **Mutex and EX**: N contenders, each its own client and session, take
//!   and release one lock with zero hold time; the printed ratio is EX ÷
//!   mutex (grants/s, and handoffs/s at N ≥ 2). Which of the two goes first
//!   alternates from one N to the next.
//! - **Mixed** ([`MIXED_WEIGHTS`], [`MIXED_CONVERT_ONE_IN`],
//!   [`mixed_conversion`]): each contender picks a mode at random by weight,
//!   locks it, sometimes converts it (up or down), and releases, with zero
//!   hold time. Printed: grants/s (and ÷ the mutex's), conversions/s,
//!   conversions refused as deadlocks, and wakeups per release from the
//!   clients' [`Client::stats`]. With shared modes one release can rightly
//!   wake several waiters (every PR request behind an EX holder is granted
//!   when it goes), so the figure is not bounded by 1 as the mutex's is.
//!
//! Every contender also tells a tracker in the process what it surely
//! holds: its mode from the return of its `lock` until just before its
//! release; while it converts, only the most restrictive mode below both
//! the old and the new one ([`common`]: CR between CW and PR, the new mode
//! of a down-conversion), and the new mode once the conversion returns.
//! Two incompatible modes tracked at once would be a broken lock; the count
//! is printed (it should read 0). The figures are printed, never judged:
//! no timing is asserted.

//!
//! The section's parts: the workload and its dice (`workload`), the flags
//! ([`ModesArgs`]), the runs that drive the contenders ([`measure`]), the
//! contenders' hold tracker, the server's counters ([`ServerCounters`]),
//! the figures ([`Figures`], [`Row`]) and the tables ([`ex_line`],
//! [`mixed_line`]).

mod args;
mod counters;
mod figures;
mod mixed;
mod resources;
mod runs;
mod table;
mod tracker;
mod workload;

use lockline::Client;

use crate::BoxResult;

pub use self::args::ModesArgs;
pub use self::counters::{NoCounters, ServerCounters};
pub use self::figures::{Figures, Row};
pub use self::runs::{ex_run, measure, mixed_run, mutex_run, unsupported};
pub use self::table::{ex_header, ex_line, mixed_header, mixed_line};
pub use self::workload::{common, mixed_conversion, mixed_description, Dice, MIXED_CONVERT_ONE_IN, MIXED_WEIGHTS};

#[cfg(doc)]
use lockline::{Error, Resource};

/// The whole lock-mode section of a program (see the module docs): a
/// heading naming `backend` (what runs it: `single-node etcd on ...`), the
/// two tables, and the failures, if any. Lock names begin with `prefix`
/// (`bench/`, say); `client` gives each contender its own client of the
/// server under test.
///
/// When the backend does not lock resources yet ([`Error::Unsupported`]),
/// prints one line saying so and measures nothing.
///
/// # Errors
///
/// When the first session cannot be opened; a measurement that fails is a
/// finding, printed in its row and below the tables.
pub async fn run(backend: &str, args: &ModesArgs, prefix: &str, client: impl FnMut() -> Client) -> BoxResult<Vec<Row>> {
    run_with(backend, args, prefix, client, &mut NoCounters).await
}

/// [`run`], with the server's `counters` per grant in the tables.
///
/// # Errors
///
/// As [`run`].
pub async fn run_with<C: ServerCounters>(
    backend: &str,
    args: &ModesArgs,
    prefix: &str,
    mut client: impl FnMut() -> Client,
    counters: &mut C,
) -> BoxResult<Vec<Row>> {
    print_heading(backend, args);
    if let Some(why) = unsupported(&format!("{prefix}modes-probe"), &mut client).await? {
        println!("not measured: a resource's try_lock answered Unsupported ({why})");
        return Ok(Vec::new());
    }
    let names = counters.names();
    println!();
    println!("{}", ex_header(&names));
    let mut rows = Vec::new();
    for (round, &n) in args.contenders.iter().enumerate() {
        let row = measure(n, round, args, prefix, &mut client, counters).await;
        println!("{}", ex_line(&row, names.len()));
        rows.push(row);
    }
    print_mixed_table(&rows, &names, args);
    print_failures(&rows);
    Ok(rows)
}

/// The section's heading: what runs it and how long each measurement is.
fn print_heading(backend: &str, args: &ModesArgs) {
    println!();
    println!(
        "Lock modes on {backend}: for each N, lockline's mutex and a Resource in EX (zero hold time; \
         which goes first alternates), then the mixed workload, {} s each, one after the other",
        args.seconds
    );
}

/// The mixed workload's table, under a line describing the workload.
fn print_mixed_table(rows: &[Row], names: &[String], args: &ModesArgs) {
    println!();
    println!("Mixed workload: {} (seed {}).", mixed_description(), args.seed);
    println!();
    println!("{}", mixed_header(names));
    for row in rows {
        println!("{}", mixed_line(row, names.len()));
    }
}

/// Every measurement that failed, and every one that saw incompatible
/// modes held at once, under the tables.
fn print_failures(rows: &[Row]) {
    let failures = failures(rows);
    if !failures.is_empty() {
        println!();
        for failure in failures {
            println!("FAILED: {failure}");
        }
    }
}

/// The measurements that failed or saw incompatible modes held at once, in
/// words.
fn failures(rows: &[Row]) -> Vec<String> {
    let mut failures: Vec<String> = Vec::new();
    for row in rows {
        for (what, outcome) in [("mutex", &row.mutex), ("EX", &row.ex), ("mixed", &row.mixed)] {
            match outcome {
                Err(error) => failures.push(format!("N = {}, {what}: {error}", row.n)),
                Ok(figures) if figures.overlaps > 0 => failures.push(format!(
                    "N = {}, {what}: incompatible modes held at once {} times",
                    row.n, figures.overlaps
                )),
                Ok(_) => {}
            }
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// The whole section against the memory backend, briefly: every
    /// measurement runs without failing, grants (counted from the start to
    /// the stop, so that a slow window cannot empty it), and no
    /// incompatible holds are seen. No timing is judged.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_section_runs_on_the_memory_backend() {
        let memory = Arc::new(lockline::MemoryBackend::new());
        let backend: Arc<dyn lockline::backend::Backend> = memory.clone();
        let args = ModesArgs {
            contenders: vec![1, 3],
            seconds: 0.3,
            ..ModesArgs::default()
        };
        let rows = run("memory", &args, "test/", || Client::from_arc(backend.clone()))
            .await
            .expect("section");
        assert_eq!(rows.iter().map(|row| row.n).collect::<Vec<_>>(), [1, 3]);
        for row in rows {
            for (what, outcome) in [("mutex", &row.mutex), ("EX", &row.ex), ("mixed", &row.mixed)] {
                let figures = outcome
                    .as_ref()
                    .unwrap_or_else(|e| panic!("N = {}, {what}: {e}", row.n));
                assert!(figures.outcome.all_grants > 0, "N = {}, {what}: no grants", row.n);
            }
            assert_eq!(row.mixed.expect("mixed").overlaps, 0);
        }
        assert!(memory.keys("test/modes-mixed-1").is_empty(), "nothing left behind");
    }
}
