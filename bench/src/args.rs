//! The handoff benchmarks' flags, and a program's own flags taken out of
//! its arguments before the shared ones are parsed.

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

    /// Parses the program's arguments; on a bad one, prints the message and
    /// `usage: PROGRAM [--seconds S] [--contenders 1,2,4,16,64]` (followed by
    /// `more_usage`, the program's own flags) to standard error and exits
    /// with status 2.
    pub fn from_env_or_exit(program: &str, more_usage: &str) -> Self {
        Self::from_env().unwrap_or_else(|message| usage_exit(&message, program, &Self::usage(more_usage)))
    }

    /// `[--seconds S] [--contenders 1,2,4,16,64]`, then `more` (a program's
    /// own flags) after a space when it is not empty.
    pub fn usage(more: &str) -> String {
        let usage = "[--seconds S] [--contenders 1,2,4,16,64]";
        if more.is_empty() {
            usage.to_owned()
        } else {
            format!("{usage} {more}")
        }
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

/// Prints `message` and `usage: PROGRAM USAGE` to standard error and exits
/// with status 2, as every benchmark program does on a bad flag.
pub fn usage_exit(message: &str, program: &str, usage: &str) -> ! {
    eprintln!("{message}\nusage: {program} {usage}");
    std::process::exit(2)
}

/// A program's own flags, taken out of its arguments so that the rest can
/// go to a shared parser ([`BenchArgs::parse`], say).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OwnFlags {
    switches: Vec<String>,
    values: Vec<(String, String)>,
}

impl OwnFlags {
    /// Takes `switches` (flags without a value) and `valued` (flags followed
    /// by a value) out of `args`; returns them and the other arguments in
    /// their order.
    ///
    /// # Errors
    ///
    /// `FLAG needs a value` when a valued flag comes last.
    pub fn take(
        args: impl IntoIterator<Item = String>,
        switches: &[&str],
        valued: &[&str],
    ) -> Result<(OwnFlags, Vec<String>), String> {
        let (mut own, mut rest) = (OwnFlags::default(), Vec::new());
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            if switches.contains(&arg.as_str()) {
                own.switches.push(arg);
            } else if valued.contains(&arg.as_str()) {
                let value = it.next().ok_or_else(|| format!("{arg} needs a value"))?;
                own.values.push((arg, value));
            } else {
                rest.push(arg);
            }
        }
        Ok((own, rest))
    }

    /// Whether the switch `flag` was given.
    pub fn switch(&self, flag: &str) -> bool {
        self.switches.iter().any(|s| s == flag)
    }

    /// The value of the last `flag` given, if any.
    pub fn value(&self, flag: &str) -> Option<&str> {
        self.values
            .iter()
            .rev()
            .find(|(name, _)| name == flag)
            .map(|(_, value)| value.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::{BenchArgs, OwnFlags};

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    fn parse(line: &str) -> Result<BenchArgs, String> {
        BenchArgs::parse(words(line))
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
    fn own_flags_are_taken_out() {
        let (own, rest) = OwnFlags::take(
            words("--seconds 2 --fast-start --warmup 3 --contenders 4 --warmup 5"),
            &["--fast-start"],
            &["--warmup"],
        )
        .expect("flags");
        assert!(own.switch("--fast-start"));
        assert!(!own.switch("--slow"));
        assert_eq!(own.value("--warmup"), Some("5"));
        assert_eq!(own.value("--engine"), None);
        assert_eq!(rest, words("--seconds 2 --contenders 4"));
        assert_eq!(
            OwnFlags::take(words("--warmup"), &[], &["--warmup"]),
            Err("--warmup needs a value".to_owned())
        );
        assert_eq!(BenchArgs::usage(""), "[--seconds S] [--contenders 1,2,4,16,64]");
        assert_eq!(
            BenchArgs::usage("[--fast-start]"),
            "[--seconds S] [--contenders 1,2,4,16,64] [--fast-start]"
        );
    }
}
