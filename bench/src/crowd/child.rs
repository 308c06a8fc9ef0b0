//! The child's end of the protocol ([`CrowdChild`]): its arguments, and
//! the lines it says to and hears from the parent.

use std::io::{BufWriter, Write};

use super::protocol::{parse_window, CrowdCounts, GrantRecord, Window};
use super::{invalid, Result, CHILD_FLAG};

/// This process, when it was started as a crowd child.
#[derive(Debug)]
pub struct CrowdChild {
    /// How many contenders this child runs.
    pub contenders: usize,
    /// The run's number (distinct per run in one program run: name the lock
    /// after it).
    pub run: usize,
    /// The arguments the parent's example passed on.
    pub args: Vec<String>,
}

impl CrowdChild {
    /// `Some` when this process was started as a crowd child
    /// (`CHILD_FLAG CONTENDERS RUN ARGS...`).
    ///
    /// # Errors
    ///
    /// When the child arguments are malformed.
    pub fn from_env() -> Result<Option<CrowdChild>> {
        Self::parse(std::env::args().skip(1))
    }

    fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<CrowdChild>> {
        let mut args = args.into_iter();
        if args.next().as_deref() != Some(CHILD_FLAG) {
            return Ok(None);
        }
        let mut number = |what: &str| {
            args.next()
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| invalid(format!("{CHILD_FLAG} needs {what}")))
        };
        let contenders = number("a contender count")?;
        let run = number("a run number")?;
        Ok(Some(CrowdChild {
            contenders,
            run,
            args: args.collect(),
        }))
    }

    fn say(&self, line: &str) -> Result<()> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")?;
        out.flush()
    }

    fn hear(&self) -> Result<String> {
        let mut line = String::new();
        if std::io::stdin().read_line(&mut line)? == 0 {
            return Err(invalid("the crowd's parent closed this child's input"));
        }
        Ok(line.trim_end().to_owned())
    }

    /// Tells the parent that this child's contenders have their sessions,
    /// and waits (blocking this thread) until every child has.
    ///
    /// # Errors
    ///
    /// When the parent is gone or says something else.
    pub fn ready(&self) -> Result<()> {
        self.say("ready")?;
        match self.hear()?.as_str() {
            "go" => Ok(()),
            other => Err(invalid(format!("expected `go` from the crowd's parent, got {other:?}"))),
        }
    }

    /// Tells the parent that every contender of this child has queued, and
    /// waits (blocking this thread) for the measured window.
    ///
    /// # Errors
    ///
    /// When the parent is gone or says something else.
    pub fn queued(&self) -> Result<Window> {
        self.say("queued")?;
        let line = self.hear()?;
        parse_window(&line).ok_or_else(|| invalid(format!("expected `window START END`, got {line:?}")))
    }

    /// Reports the window's counts and the grants within it.
    ///
    /// # Errors
    ///
    /// When standard output is closed.
    pub fn report(&self, counts: CrowdCounts, records: &[GrantRecord], window: Window) -> Result<()> {
        let mut out = BufWriter::new(std::io::stdout().lock());
        writeln!(out, "counts {} {} {}", counts.grants, counts.wakeups, counts.releases)?;
        for record in records.iter().filter(|r| window.contains(r.granted_ns)) {
            writeln!(
                out,
                "grant {} {} {}",
                record.token, record.granted_ns, record.release_started_ns
            )?;
        }
        writeln!(out, "done")?;
        out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_arguments() {
        let args = |line: &str| line.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert!(CrowdChild::parse(args("--seconds 5")).expect("not a child").is_none());
        let child = CrowdChild::parse(args("--crowd-child 250 3 127.0.0.1:2181"))
            .expect("child")
            .expect("a child");
        assert_eq!(
            (child.contenders, child.run, child.args),
            (250, 3, args("127.0.0.1:2181"))
        );
        assert!(CrowdChild::parse(args("--crowd-child x")).is_err());
    }
}
