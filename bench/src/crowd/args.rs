//! The options every crowd example takes ([`CrowdArgs`]).

use std::ops::RangeInclusive;
use std::str::FromStr;

/// The options every crowd example takes:
/// `[--seconds S] [--processes P] [--crowd N] [--compare 16,64] [--warmup S]`.
#[derive(Debug, Clone, PartialEq)]
pub struct CrowdArgs {
    /// Seconds per measurement (0.1..=600, default 5).
    pub seconds: f64,
    /// Child processes of the multi-process runs (default 4).
    pub processes: usize,
    /// Contenders of the crowd run (default 1,000).
    pub crowd: usize,
    /// Contender counts measured both in one process and in `processes`
    /// (default 16 and 64); the largest is the crowd's yardstick.
    pub compare: Vec<usize>,
    /// Seconds of an unmeasured run first (to warm up a JIT-compiled server).
    pub warmup: f64,
}

impl CrowdArgs {
    /// Parses the program's arguments; `switches` are the example's own
    /// flags without a value, returned when given.
    ///
    /// # Errors
    ///
    /// A message naming the bad argument.
    pub fn from_env(switches: &[&str], warmup: f64) -> std::result::Result<(Self, Vec<String>), String> {
        Self::parse(std::env::args().skip(1), switches, warmup)
    }

    /// Parses the given arguments, as [`from_env`](Self::from_env).
    ///
    /// # Errors
    ///
    /// A message naming the bad argument.
    pub fn parse(
        args: impl IntoIterator<Item = String>,
        switches: &[&str],
        warmup: f64,
    ) -> std::result::Result<(Self, Vec<String>), String> {
        let mut parsed = CrowdArgs {
            seconds: 5.0,
            processes: 4,
            crowd: 1000,
            compare: vec![16, 64],
            warmup,
        };
        let mut given = Vec::new();
        let mut it = args.into_iter();
        while let Some(flag) = it.next() {
            if switches.contains(&flag.as_str()) {
                given.push(flag);
                continue;
            }
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let bad = || format!("bad {flag} {value:?}");
            match flag.as_str() {
                "--seconds" => parsed.seconds = within(&flag, &value, 0.1..=600.0, "0.1..=600")?,
                "--warmup" => parsed.warmup = within(&flag, &value, 0.0..=600.0, "0..=600")?,
                "--processes" => parsed.processes = within(&flag, &value, 1..=64, "1..=64")?,
                "--crowd" => parsed.crowd = within(&flag, &value, 1..=10_000, "1..=10000")?,
                "--compare" => {
                    parsed.compare = value
                        .split(',')
                        .map(|n| n.parse().map_err(|_| bad()))
                        .collect::<std::result::Result<_, _>>()?;
                    if parsed.compare.iter().any(|&n| n == 0 || n > 10_000) {
                        return Err("--compare counts must be within 1..=10000".into());
                    }
                }
                other => return Err(format!("unknown flag {other:?}")),
            }
        }
        Ok((parsed, given))
    }

    /// The usage line's options.
    pub const USAGE: &'static str = "[--seconds 5] [--processes 4] [--crowd 1000] [--compare 16,64] [--warmup S]";
}

/// `flag`'s `value`, parsed and within `range` (`shown` in the message).
fn within<T: FromStr + PartialOrd>(
    flag: &str,
    value: &str,
    range: RangeInclusive<T>,
    shown: &str,
) -> std::result::Result<T, String> {
    let parsed: T = value.parse().map_err(|_| format!("bad {flag} {value:?}"))?;
    if range.contains(&parsed) {
        Ok(parsed)
    } else {
        Err(format!("{flag} must be within {shown}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crowd_arguments() {
        let parse = |line: &str| CrowdArgs::parse(line.split_whitespace().map(str::to_owned), &["--fast-start"], 0.0);
        let (defaults, given) = parse("").expect("defaults");
        assert_eq!(
            (defaults.seconds, defaults.processes, defaults.crowd, defaults.compare),
            (5.0, 4, 1000, vec![16, 64])
        );
        assert!(given.is_empty());
        let (custom, given) = parse("--fast-start --crowd 200 --compare 8 --warmup 3").expect("custom");
        assert_eq!((custom.crowd, custom.compare, custom.warmup), (200, vec![8], 3.0));
        assert_eq!(given, vec!["--fast-start".to_owned()]);
        for bad in ["--crowd 0", "--processes", "--compare 1,x", "--speed 2", "--seconds 0"] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
