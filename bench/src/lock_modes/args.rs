//! The lock-mode section's flags ([`ModesArgs`]).

use crate::OwnFlags;

/// The lock-mode section's flags, taken out of a program's own:
/// `[--modes-only] [--modes-contenders 1,4,16] [--modes-seconds 2] [--modes-seed 1]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModesArgs {
    /// Only the lock-mode section (after the server's start and the
    /// program's warm-up, if any).
    pub only: bool,
    /// The contender counts (each 1..=1024; default 1, 4, 16).
    pub contenders: Vec<usize>,
    /// Seconds per measurement (0.1..=600; default 2): three measurements
    /// per N.
    pub seconds: f64,
    /// The mixed workload's seed (default 1).
    pub seed: u64,
}

impl Default for ModesArgs {
    fn default() -> Self {
        ModesArgs {
            only: false,
            contenders: vec![1, 4, 16],
            seconds: 2.0,
            seed: 1,
        }
    }
}

impl ModesArgs {
    /// The switches to take out of the arguments ([`OwnFlags::take`]).
    pub const SWITCHES: &'static [&'static str] = &["--modes-only"];
    /// The flags with a value to take out.
    pub const VALUED: &'static [&'static str] = &["--modes-contenders", "--modes-seconds", "--modes-seed"];
    /// Their usage.
    pub const USAGE: &'static str = "[--modes-only] [--modes-contenders 1,4,16] [--modes-seconds 2] [--modes-seed 1]";

    /// The section's flags among `own`.
    ///
    /// # Errors
    ///
    /// A message naming the bad flag.
    pub fn from_flags(own: &OwnFlags) -> Result<Self, String> {
        let mut args = ModesArgs {
            only: own.switch("--modes-only"),
            ..ModesArgs::default()
        };
        if let Some(list) = own.value("--modes-contenders") {
            args.contenders = list
                .split(',')
                .map(|n| n.parse().ok().filter(|n| (1..=1024).contains(n)))
                .collect::<Option<Vec<usize>>>()
                .ok_or_else(|| format!("bad --modes-contenders {list:?}: counts within 1..=1024"))?;
        }
        if let Some(value) = own.value("--modes-seconds") {
            args.seconds = value
                .parse()
                .ok()
                .filter(|s| (0.1..=600.0).contains(s))
                .ok_or_else(|| format!("bad --modes-seconds {value:?}: within 0.1..=600"))?;
        }
        if let Some(value) = own.value("--modes-seed") {
            args.seed = value.parse().map_err(|_| format!("bad --modes-seed {value:?}"))?;
        }
        Ok(args)
    }

    /// Takes these flags and `switches`/`valued` (the program's own) out of
    /// `args`; returns them, the program's own flags and the rest.
    ///
    /// # Errors
    ///
    /// A message naming the bad flag.
    pub fn take(
        args: impl IntoIterator<Item = String>,
        switches: &[&str],
        valued: &[&str],
    ) -> Result<(ModesArgs, OwnFlags, Vec<String>), String> {
        let switches = [switches, Self::SWITCHES].concat();
        let valued = [valued, Self::VALUED].concat();
        let (own, rest) = OwnFlags::take(args, &switches, &valued)?;
        Ok((Self::from_flags(&own)?, own, rest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn flags_are_taken_out_with_the_programs_own() {
        let (modes, own, rest) = ModesArgs::take(
            words("--seconds 3 --modes-only --warmup 4 --modes-contenders 2,8 --modes-seconds 0.5 --modes-seed 7"),
            &[],
            &["--warmup"],
        )
        .expect("flags");
        assert_eq!(
            modes,
            ModesArgs {
                only: true,
                contenders: vec![2, 8],
                seconds: 0.5,
                seed: 7
            }
        );
        assert_eq!(own.value("--warmup"), Some("4"));
        assert_eq!(rest, words("--seconds 3"));
        let (defaults, _, _) = ModesArgs::take(Vec::new(), &[], &[]).expect("none");
        assert_eq!(defaults, ModesArgs::default());
        for bad in [
            "--modes-contenders 0",
            "--modes-contenders 1,x",
            "--modes-seconds 0",
            "--modes-seed -1",
        ] {
            assert!(ModesArgs::take(words(bad), &[], &[]).is_err(), "{bad:?} accepted");
        }
    }
}
