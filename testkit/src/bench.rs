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
}
