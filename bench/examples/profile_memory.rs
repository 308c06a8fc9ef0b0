//! One workload on the in-process memory backend, alone, for a profiler:
//! the mutex or a `Resource` in EX, N contenders, zero hold time.
//!
//! ```text
//! cargo build --release -p lockline-bench --example profile_memory
//! valgrind --tool=callgrind target/release/examples/profile_memory ex 4 1
//! valgrind --tool=callgrind target/release/examples/profile_memory mutex 4 1
//! ```
//!
//! Prints the grants counted until the contenders stopped: divide a
//! function's inclusive cost (`callgrind_annotate --inclusive=yes`) by
//! them for its cost per grant. `bench_memory` runs both side by side and
//! prints their ratio; this program runs one, so that a profile holds one.

use std::sync::Arc;

use lockline::backend::Backend;
use lockline::{Client, MemoryBackend};
use lockline_bench::lock_modes;
use lockline_bench::{usage_exit, BoxResult};

const USAGE: &str = "<ex|mutex> [N (default 4)] [seconds (default 3)]";

#[tokio::main]
async fn main() -> BoxResult<()> {
    let fail = |message: &str| -> ! { usage_exit(message, "profile_memory", USAGE) };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args
        .first()
        .map(String::as_str)
        .unwrap_or_else(|| fail("name a workload"));
    let n: usize = match args.get(1) {
        Some(n) => n
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or_else(|| fail("N is a count above 0")),
        None => 4,
    };
    let seconds: f64 = match args.get(2) {
        Some(s) => s
            .parse()
            .ok()
            .filter(|s: &f64| s.is_finite() && *s > 0.0)
            .unwrap_or_else(|| fail("seconds is a number above 0")),
        None => 3.0,
    };
    if args.len() > 3 {
        fail("too many arguments");
    }
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let mut client = || Client::from_arc(Arc::clone(&backend));
    let figures = match which {
        "ex" => lock_modes::ex_run(n, seconds, "profile/ex", &mut client).await?,
        "mutex" => lock_modes::mutex_run(n, seconds, "profile/mutex", &mut client).await?,
        other => fail(&format!("unknown workload {other:?}")),
    };
    let outcome = &figures.outcome;
    println!(
        "{which}, N = {n}: {} grants until the contenders stopped ({} in the {:.1} s window, {} handoffs), {:.2} wakeups per release",
        outcome.all_grants, outcome.grants, outcome.seconds, outcome.handoffs, figures.wakeups_per_release
    );
    Ok(())
}
