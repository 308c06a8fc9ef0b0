//! What the `metrics` feature costs on the memory backend, where nothing
//! else hides it: an uncontended acquire + release, and a handoff between
//! two contenders, built with the feature off and on, measured in one run.
//!
//! ```sh
//! cargo build --release --example metrics_cost
//! cp target/release/examples/metrics_cost /tmp/metrics_cost-off
//! cargo build --release --example metrics_cost --features metrics
//! cp target/release/examples/metrics_cost /tmp/metrics_cost-on
//! /tmp/metrics_cost-on compare /tmp/metrics_cost-off /tmp/metrics_cost-on 7
//! ```
//!
//! `compare OFF ON ROUNDS` runs, ROUNDS times in turn, a fresh process of
//! each build: `OFF run off`, `ON run noop` (the feature on, no recorder
//! installed) and `ON run prometheus` (the feature on, recording into
//! `metrics-exporter-prometheus`'s recorder), and prints each one's median
//! and its ratio to the build without the feature. `run MODE` measures one
//! mode and prints one line.

use std::process::Command;
use std::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Acquire + release pairs per uncontended measurement, handoffs per
/// contended one.
const OPS: u32 = 20_000;

/// Nanoseconds per uncontended acquire + release on one session.
async fn uncontended() -> Result<f64, BoxError> {
    let client = lockline::Client::memory();
    let session = client.session().await?;
    let mutex = session.mutex("cost/uncontended")?;
    for _ in 0..1_000 {
        mutex.lock().await?.release().await?;
    }
    let start = Instant::now();
    for _ in 0..OPS {
        mutex.lock().await?.release().await?;
    }
    let elapsed = start.elapsed();
    session.close().await?;
    Ok(elapsed.as_nanos() as f64 / f64::from(OPS))
}

/// Nanoseconds per handoff: two contenders on two sessions take turns,
/// each queued behind the other, so every grant after the first follows a
/// release and a wakeup (each holder yields once while it holds, so that
/// the other queues behind it).
async fn handoffs() -> Result<f64, BoxError> {
    let client = lockline::Client::memory();
    let start_wakeups = client.stats().wakeups;
    let mut tasks = Vec::new();
    let start = Instant::now();
    for _ in 0..2 {
        let session = client.session().await?;
        tasks.push(tokio::spawn(async move {
            let mutex = session.mutex("cost/handoff")?;
            for _ in 0..OPS / 2 {
                let guard = mutex.lock().await?;
                // Let the other contender queue behind this holder.
                tokio::task::yield_now().await;
                guard.release().await?;
            }
            session.close().await?;
            Ok::<_, BoxError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let elapsed = start.elapsed();
    let woken = client.stats().wakeups - start_wakeups;
    if woken < u64::from(OPS) / 2 {
        return Err(format!("only {woken} of {OPS} grants were handoffs").into());
    }
    Ok(elapsed.as_nanos() as f64 / woken as f64)
}

fn measure() -> Result<(f64, f64), BoxError> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async { Ok((uncontended().await?, handoffs().await?)) })
}

fn run(mode: &str) -> Result<(f64, f64), BoxError> {
    match (mode, cfg!(feature = "metrics")) {
        ("off", false) | ("noop", true) => measure(),
        ("prometheus", true) => prometheus(),
        _ => Err(format!("mode {mode} is not for this build").into()),
    }
}

#[cfg(feature = "metrics")]
fn prometheus() -> Result<(f64, f64), BoxError> {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_seconds".into()),
            lockline::metrics::BUCKETS,
        )?
        .build_recorder();
    let handle = recorder.handle();
    // One thread runs every task: the local recorder sees every record.
    let measured = metrics::with_local_recorder(&recorder, measure)?;
    if !handle.render().contains("lockline_handoff_seconds_bucket") {
        return Err("the recorder saw no handoff".into());
    }
    Ok(measured)
}

#[cfg(not(feature = "metrics"))]
fn prometheus() -> Result<(f64, f64), BoxError> {
    Err("built without the metrics feature".into())
}

fn child(binary: &str, mode: &str) -> Result<(f64, f64), BoxError> {
    let output = Command::new(binary).args(["run", mode]).output()?;
    if !output.status.success() {
        return Err(format!("{binary} run {mode}: {}", String::from_utf8_lossy(&output.stderr)).into());
    }
    let text = String::from_utf8(output.stdout)?;
    let mut fields = text.split_whitespace().skip(1).map(str::parse::<f64>);
    match (fields.next(), fields.next()) {
        (Some(Ok(a)), Some(Ok(b))) => Ok((a, b)),
        _ => Err(format!("{binary} run {mode} printed {text:?}").into()),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn compare(off: &str, on: &str, rounds: usize) -> Result<(), BoxError> {
    let modes = [(off, "off"), (on, "noop"), (on, "prometheus")];
    let mut results: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); modes.len()];
    for _ in 0..rounds {
        for (at, (binary, mode)) in modes.iter().enumerate() {
            let (uncontended, handoff) = child(binary, mode)?;
            results[at].0.push(uncontended);
            results[at].1.push(handoff);
        }
    }
    let medians: Vec<(f64, f64)> = results.into_iter().map(|(u, h)| (median(u), median(h))).collect();
    let (base_u, base_h) = medians[0];
    println!("memory backend, median of {rounds} alternating runs, {OPS} operations each");
    println!(
        "{:<28}{:>22}{:>10}{:>18}{:>10}",
        "build", "acquire+release ns", "ratio", "handoff ns", "ratio"
    );
    for ((_, mode), (u, h)) in modes.iter().zip(&medians) {
        let label = match *mode {
            "off" => "feature off",
            "noop" => "feature on, no recorder",
            _ => "feature on, Prometheus",
        };
        println!("{label:<28}{u:>22.0}{:>10.3}{h:>18.0}{:>10.3}", u / base_u, h / base_h);
    }
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["run", mode] => {
            let (uncontended, handoff) = run(mode)?;
            println!("{mode} {uncontended:.1} {handoff:.1}");
        }
        ["compare", off, on, rounds] => compare(off, on, rounds.parse()?)?,
        ["compare", off, on] => compare(off, on, 7)?,
        _ => {
            eprintln!("usage: metrics_cost run off|noop|prometheus | compare OFF_BINARY ON_BINARY [ROUNDS]");
            std::process::exit(2);
        }
    }
    Ok(())
}
