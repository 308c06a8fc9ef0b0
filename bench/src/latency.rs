//! Latency samples and their percentiles, the timed loop of one client's
//! sequential calls (a benchmark's B_write), and this process's memory.

use std::time::{Duration, Instant};

/// Latency samples and their percentiles, for the benchmarks' p50/p99 lines.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    samples: Vec<Duration>,
}

impl Latencies {
    /// No samples yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one sample.
    pub fn push(&mut self, sample: Duration) {
        self.samples.push(sample);
    }

    /// Adds every sample of `other`.
    pub fn extend(&mut self, other: Latencies) {
        self.samples.extend(other.samples);
    }

    /// How many samples there are.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The `q`-quantile (0.0..=1.0, nearest rank), or `None` without samples.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.samples.is_empty() {
            return None;
        }
        let mut sorted = self.samples.clone();
        sorted.sort_unstable();
        let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
        Some(sorted[rank.clamp(1, sorted.len()) - 1])
    }

    /// `p50 / p99` in milliseconds with two decimals (`-` without samples).
    pub fn p50_p99(&self) -> String {
        match (self.quantile(0.5), self.quantile(0.99)) {
            (Some(p50), Some(p99)) => format!("{:.2} / {:.2}", ms(p50), ms(p99)),
            _ => "-".to_owned(),
        }
    }
}

/// A duration in milliseconds.
pub fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// This process's resident memory (`VmRSS`) in KiB; 0 when unknown.
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// One client's sequential calls for a while: how many per second, and
/// each one's latency. A benchmark's B_write (one client's sequential
/// writes) is this, with a write as the call:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (per_sec, latencies) = lockline_bench::sequential(0.1, async |_call: u64| {
///     tokio::task::yield_now().await;
///     Ok::<(), std::io::Error>(())
/// })
/// .await
/// .expect("calls");
/// assert!(per_sec > 0.0 && !latencies.is_empty());
/// # }
/// ```
///
/// Calls are made one after the other until `seconds` have passed since
/// the first began; `call` gets each call's number (0, 1, ...). The rate is
/// the calls made over the time they took.
///
/// # Errors
///
/// The first call that fails.
pub async fn sequential<E>(
    seconds: f64,
    mut call: impl AsyncFnMut(u64) -> Result<(), E>,
) -> Result<(f64, Latencies), E> {
    let mut latencies = Latencies::new();
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed().as_secs_f64() < seconds {
        let one = Instant::now();
        call(n).await?;
        latencies.push(one.elapsed());
        n += 1;
    }
    Ok((n as f64 / started.elapsed().as_secs_f64(), latencies))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn quantiles_by_nearest_rank() {
        let mut latencies = super::Latencies::new();
        assert_eq!(latencies.quantile(0.5), None);
        assert_eq!(latencies.p50_p99(), "-");
        for ms in 1..=100 {
            latencies.push(Duration::from_millis(ms));
        }
        assert_eq!(latencies.quantile(0.5), Some(Duration::from_millis(50)));
        assert_eq!(latencies.quantile(0.99), Some(Duration::from_millis(99)));
        assert_eq!(latencies.quantile(1.0), Some(Duration::from_millis(100)));
        assert_eq!(latencies.p50_p99(), "50.00 / 99.00");
    }
}
