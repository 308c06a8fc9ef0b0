/// The options every handoff benchmark takes:
/// `[--seconds S] [--contenders 1,2,4,16,64]`.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    /// Seconds per measurement (0.1..=600, default 5).
    pub seconds: f64,
    /// Contender counts to measure (each 1..=1024).
    pub contenders: Vec<usize>,
}

impl BenchArgs {
    /// Parses the program's arguments.
    ///
    /// # Errors
    ///
    /// A message naming the bad argument.
    pub fn from_env() -> Result<Self, String> {
        Self::parse(std::env::args().skip(1))
    }

    /// Parses the given arguments.
    ///
    /// # Errors
    ///
    /// A message naming the bad argument.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        let mut parsed = BenchArgs {
            seconds: 5.0,
            contenders: vec![1, 2, 4, 16, 64],
        };
        let mut it = args.into_iter();
        while let Some(flag) = it.next() {
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--seconds" => {
                    parsed.seconds = value.parse().map_err(|_| format!("bad --seconds {value:?}"))?;
                    if !(0.1..=600.0).contains(&parsed.seconds) {
                        return Err("--seconds must be within 0.1..=600".into());
                    }
                }
                "--contenders" => {
                    parsed.contenders = value
                        .split(',')
                        .map(|n| n.parse().map_err(|_| format!("bad contender count {n:?}")))
                        .collect::<Result<_, _>>()?;
                    if parsed.contenders.iter().any(|&n| n == 0 || n > 1024) {
                        return Err("contender counts must be within 1..=1024".into());
                    }
                }
                other => return Err(format!("unknown flag {other:?}")),
            }
        }
        Ok(parsed)
    }
}

/// Latency samples and their percentiles, for the benchmarks' p50/p99 lines.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    samples: Vec<std::time::Duration>,
}

impl Latencies {
    /// No samples yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one sample.
    pub fn push(&mut self, sample: std::time::Duration) {
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
    pub fn quantile(&self, q: f64) -> Option<std::time::Duration> {
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
pub fn ms(duration: std::time::Duration) -> f64 {
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

#[cfg(test)]
mod tests {
    use super::BenchArgs;

    fn parse(line: &str) -> Result<BenchArgs, String> {
        BenchArgs::parse(line.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn defaults_and_overrides() {
        let defaults = parse("").expect("defaults");
        assert_eq!((defaults.seconds, defaults.contenders), (5.0, vec![1, 2, 4, 16, 64]));
        let custom = parse("--seconds 2 --contenders 3,7").expect("custom");
        assert_eq!((custom.seconds, custom.contenders), (2.0, vec![3, 7]));
        for bad in [
            "--seconds",
            "--seconds 0",
            "--contenders 0",
            "--contenders x",
            "--speed 2",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let mut latencies = super::Latencies::new();
        assert_eq!(latencies.quantile(0.5), None);
        assert_eq!(latencies.p50_p99(), "-");
        for ms in 1..=100 {
            latencies.push(std::time::Duration::from_millis(ms));
        }
        assert_eq!(latencies.quantile(0.5), Some(std::time::Duration::from_millis(50)));
        assert_eq!(latencies.quantile(0.99), Some(std::time::Duration::from_millis(99)));
        assert_eq!(latencies.quantile(1.0), Some(std::time::Duration::from_millis(100)));
        assert_eq!(latencies.p50_p99(), "50.00 / 99.00");
    }
}
