//! The plan of a crowd example ([`run_plan`]): the warm-up, the runs in
//! one process and in several, the crowd; the table and the comparisons
//! printed under it.

use std::fmt;
use std::time::Instant;

use super::{Crowd, CrowdArgs, CrowdResult, Result};

impl fmt::Display for CrowdResult {
    /// A row of the table [`run_plan`] prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "| {} | {} | {:.0} | {:.2} | {} | {} | {} |",
            self.contenders,
            self.processes,
            self.grants_per_sec(),
            self.wakeups_per_release(),
            self.handoff.p50_p99(),
            self.handoff.len(),
            self.overlaps + self.duplicate_tokens,
        )
    }
}

/// Columns a crowd example adds to [`run_plan`]'s table: figures it
/// measures itself around each run (a server's connections, say).
pub trait ExtraColumns {
    /// The added columns' headers.
    fn headers(&self) -> Vec<String>;
    /// Called just before each run starts its children.
    fn before_run(&mut self);
    /// The added cells of the run that just ended.
    fn after_run(&mut self, result: &CrowdResult) -> Vec<String>;
}

/// No added columns.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoExtraColumns;

impl ExtraColumns for NoExtraColumns {
    fn headers(&self) -> Vec<String> {
        Vec::new()
    }

    fn before_run(&mut self) {}

    fn after_run(&mut self, _: &CrowdResult) -> Vec<String> {
        Vec::new()
    }
}

/// Runs the plan of a crowd example and prints it as it goes: the warm-up
/// (when asked for), each `compare` count in one process and in
/// `processes`, then the crowd in `processes`; then the comparisons (one
/// process against many; the crowd against the largest `compare` count).
/// `child_args` are passed on to every child.
///
/// # Errors
///
/// When a run fails ([`Crowd::run`]).
pub fn run_plan(args: &CrowdArgs, child_args: &[String]) -> Result<Vec<CrowdResult>> {
    run_plan_with(args, child_args, &mut NoExtraColumns)
}

/// [`run_plan`], with `extra` columns in the table.
///
/// # Errors
///
/// When a run fails ([`Crowd::run`]).
pub fn run_plan_with(
    args: &CrowdArgs,
    child_args: &[String],
    extra: &mut dyn ExtraColumns,
) -> Result<Vec<CrowdResult>> {
    let mut runs = Runs { child_args, started: 0 };
    if args.warmup > 0.0 {
        warm_up(&mut runs, args)?;
    }
    print_table_header(&extra.headers());
    let mut results = Vec::new();
    for &n in &args.compare {
        for processes in [1, args.processes] {
            results.push(measured_row(&mut runs, n, processes, args.seconds, extra)?);
        }
    }
    results.push(measured_row(
        &mut runs,
        args.crowd,
        args.processes,
        args.seconds,
        extra,
    )?);
    println!();
    for line in comparisons(&results, args) {
        println!("{line}");
    }
    Ok(results)
}

/// The plan's runs, numbered from 1 in the order they start, each child
/// given `child_args`.
struct Runs<'a> {
    child_args: &'a [String],
    started: usize,
}

impl Runs<'_> {
    /// Runs the next crowd: `contenders` over `processes` children,
    /// measured for `seconds`.
    fn crowd(&mut self, contenders: usize, processes: usize, seconds: f64) -> Result<CrowdResult> {
        self.started += 1;
        Crowd {
            processes,
            contenders,
            run: self.started,
            seconds,
            args: self.child_args.to_vec(),
        }
        .run()
    }
}

/// An unmeasured run at N = 64 for `args.warmup` seconds, and a line
/// saying how long it took.
fn warm_up(runs: &mut Runs<'_>, args: &CrowdArgs) -> Result<()> {
    let started = Instant::now();
    let warm = runs.crowd(64, args.processes, args.warmup)?;
    println!(
        "warm-up (not measured): {:.1} s in all, {:.1} s of handoffs at N = 64 in {} processes",
        started.elapsed().as_secs_f64(),
        warm.seconds,
        warm.processes
    );
    Ok(())
}

/// The table's header and rule, with the added columns' `headers`.
fn print_table_header(headers: &[String]) {
    println!();
    println!(
        "| N | processes | grants/s | wakeups/release (client) | handoff p50 / p99 (ms) | handoffs measured | overlapping holds |{}",
        headers.iter().map(|h| format!(" {h} |")).collect::<String>()
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|{}", "---:|".repeat(headers.len()));
}

/// One measured run and its row in the table, with the `extra` columns
/// measured around it.
fn measured_row(
    runs: &mut Runs<'_>,
    contenders: usize,
    processes: usize,
    seconds: f64,
    extra: &mut dyn ExtraColumns,
) -> Result<CrowdResult> {
    extra.before_run();
    let result = runs.crowd(contenders, processes, seconds)?;
    let cells = extra.after_run(&result);
    println!(
        "{result}{}",
        cells.iter().map(|c| format!(" {c} |")).collect::<String>()
    );
    Ok(result)
}

/// The comparison lines under the table.
fn comparisons(results: &[CrowdResult], args: &CrowdArgs) -> Vec<String> {
    let find = |n: usize, p: usize| results.iter().find(|r| r.contenders == n && r.processes == p);
    let mut lines = Vec::new();
    for &n in &args.compare {
        if let (Some(one), Some(many)) = (find(n, 1), find(n, args.processes.min(n))) {
            if many.processes > 1 {
                lines.push(format!(
                    "one process vs {} at N = {n}: grants/s {:.0} vs {:.0} ({} / 1 process = {:.2}); \
                     handoff p99 {:.2} vs {:.2} ms ({:.2})",
                    many.processes,
                    one.grants_per_sec(),
                    many.grants_per_sec(),
                    many.processes,
                    many.grants_per_sec() / one.grants_per_sec(),
                    one.p99_ms(),
                    many.p99_ms(),
                    many.p99_ms() / one.p99_ms(),
                ));
            }
        }
    }
    let yardstick = args.compare.iter().copied().max();
    let crowd = results.last();
    if let (Some(n), Some(crowd)) = (yardstick, crowd) {
        if let Some(base) = find(n, crowd.processes.min(n)) {
            let ratio = crowd.p99_ms() / base.p99_ms();
            let verdict = |met: bool| if met { "met" } else { "missed" };
            lines.push(format!(
                "N = {} vs N = {n} ({} processes): handoff p99 {:.2} vs {:.2} ms = {ratio:.2} \
                 (target ≤ 1.5: {}); wakeups/release {:.2} (target ≤ 1.05: {}); grants/s {:.0} vs {:.0} ({:.2})",
                crowd.contenders,
                crowd.processes,
                crowd.p99_ms(),
                base.p99_ms(),
                verdict(ratio <= 1.5),
                crowd.wakeups_per_release(),
                verdict(crowd.wakeups_per_release() <= 1.05),
                crowd.grants_per_sec(),
                base.grants_per_sec(),
                crowd.grants_per_sec() / base.grants_per_sec(),
            ));
        }
    }
    let broken: usize = results.iter().map(|r| r.overlaps + r.duplicate_tokens).sum();
    lines.push(format!(
        "overlapping holds (a grant before its predecessor began to release, or a token granted twice): {broken}"
    ));
    lines
}
