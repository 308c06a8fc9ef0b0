//! Throwaway: one workload only, for profiling. Not committed.
use std::sync::Arc;

use lockline::backend::Backend;
use lockline::{Client, MemoryBackend};
use lockline_bench::lock_modes;
use lockline_bench::BoxResult;

#[tokio::main]
async fn main() -> BoxResult<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map(String::as_str).unwrap_or("ex");
    let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(4);
    let secs: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let mut client = || Client::from_arc(Arc::clone(&backend));
    let f = if which == "ex" {
        lock_modes::ex_run(n, secs, "prof/ex", &mut client).await?
    } else {
        lock_modes::mutex_run(n, secs, "prof/mutex", &mut client).await?
    };
    println!("{which} {f:?}");
    Ok(())
}
