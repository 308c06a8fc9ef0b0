//! The lock modes beside the mutex on the in-process memory backend.
//!
//! ```text
//! cargo run --release -p lockline-bench --example bench_memory [-- --modes-contenders 1,4,16 --modes-seconds 2 --modes-seed 1]
//! ```
//!
//! For each N: lockline's mutex and a `Resource` in EX, N contenders each,
//! zero hold time, side by side (EX ÷ mutex), then the mixed workload of
//! the six modes with conversions (grants/s, wakeups per release from the
//! clients' `stats()`). Every contender has its own client and session over
//! one shared `MemoryBackend`, so what is measured is lockline's own work
//! per grant: there is no server and no network. See
//! `lockline_bench::lock_modes`; the same section ends the other backends'
//! `bench_*` programs. `--modes-only` is accepted (the program measures
//! nothing else).

use std::sync::Arc;

use lockline::backend::Backend;
use lockline::{Client, MemoryBackend};
use lockline_bench::lock_modes::{self, ModesArgs};
use lockline_bench::{usage_exit, BoxResult};

#[tokio::main]
async fn main() -> BoxResult<()> {
    let fail = |message: String| -> ! { usage_exit(&message, "bench_memory", ModesArgs::USAGE) };
    let (args, _, rest) = ModesArgs::take(std::env::args().skip(1), &[], &[]).unwrap_or_else(|m| fail(m));
    if let Some(unknown) = rest.first() {
        fail(format!("unknown flag {unknown:?}"));
    }
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let on = "the memory backend (one in-process store for every contender's client, no server)";
    lock_modes::run(on, &args, "bench/", || Client::from_arc(Arc::clone(&backend))).await?;
    Ok(())
}
