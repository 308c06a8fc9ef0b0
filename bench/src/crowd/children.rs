//! The parent's end of the protocol: the child processes, their lines,
//! and their exit.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lockline_testkit::spawn_tied_to_this_process;

use super::protocol::{parse_report_line, CrowdCounts, GrantRecord, ReportLine};
use super::{invalid, Crowd, Result, CHILD_FLAG};

/// How `contenders` are spread over `processes` (as evenly as can be).
fn shares(contenders: usize, processes: usize) -> Vec<usize> {
    let processes = processes.clamp(1, contenders.max(1));
    (0..processes)
        .map(|i| contenders / processes + usize::from(i < contenders % processes))
        .collect()
}

pub(super) struct Children {
    pub(super) procs: Vec<(Child, Option<ChildStdin>)>,
    lines: mpsc::Receiver<(usize, Option<String>)>,
}

impl Children {
    pub(super) fn spawn(crowd: &Crowd) -> Result<Children> {
        let exe = std::env::current_exe()?;
        let (tx, lines) = mpsc::channel();
        let mut procs = Vec::new();
        for (i, share) in shares(crowd.contenders, crowd.processes).into_iter().enumerate() {
            let mut command = Command::new(&exe);
            command
                .arg(CHILD_FLAG)
                .arg(share.to_string())
                .arg(crowd.run.to_string())
                .args(&crowd.args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            let mut child = spawn_tied_to_this_process(command)?;
            let stdout = child.stdout.take().ok_or_else(|| invalid("no child stdout"))?;
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(std::result::Result::ok) {
                    if tx.send((i, Some(line))).is_err() {
                        return;
                    }
                }
                let _ = tx.send((i, None));
            });
            let stdin = child.stdin.take();
            procs.push((child, stdin));
        }
        Ok(Children { procs, lines })
    }

    pub(super) fn tell_all(&mut self, line: &str) -> Result<()> {
        for (i, (_, stdin)) in self.procs.iter_mut().enumerate() {
            let stdin = stdin
                .as_mut()
                .ok_or_else(|| invalid(format!("crowd child {i}: input closed")))?;
            writeln!(stdin, "{line}")?;
            stdin.flush()?;
        }
        Ok(())
    }

    /// The next line of any child before `deadline`, or `None` when that
    /// child closed its output.
    fn next(&mut self, deadline: Instant, waiting_for: &str) -> Result<(usize, Option<String>)> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.lines.recv_timeout(left).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("crowd children did not send {waiting_for} in time"),
            )
        })
    }

    fn closed_early(&mut self, i: usize, waiting_for: &str) -> std::io::Error {
        invalid(format!(
            "crowd child {i} closed its output ({}) while the parent waited for {waiting_for}",
            self.exit_status(i)
        ))
    }

    /// How child `i` exited (waiting a little for it), for an error message.
    fn exit_status(&mut self, i: usize) -> String {
        let child = &mut self.procs[i].0;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return format!("it exited with {status}"),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                Ok(None) => return "it still runs".to_owned(),
                Err(error) => return format!("its status is unknown: {error}"),
            }
        }
    }

    /// Waits until every child has said `word`.
    pub(super) fn expect_all(&mut self, word: &str, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        let mut heard = vec![false; self.procs.len()];
        while heard.iter().any(|h| !h) {
            let waiting_for = format!("`{word}`");
            let (i, line) = self.next(deadline, &waiting_for)?;
            let Some(line) = line else {
                return Err(self.closed_early(i, &waiting_for));
            };
            if line == word {
                heard[i] = true;
            } else {
                eprintln!("crowd child {i}: {line}");
            }
        }
        Ok(())
    }

    /// Reads every child's report.
    pub(super) fn reports(&mut self, within: Duration) -> Result<(Vec<CrowdCounts>, Vec<GrantRecord>)> {
        let deadline = Instant::now() + within;
        let mut counts = vec![None; self.procs.len()];
        let mut done = vec![false; self.procs.len()];
        let mut records = Vec::new();
        while done.iter().any(|d| !d) {
            let (i, line) = self.next(deadline, "their reports")?;
            let Some(line) = line else {
                // A child that has reported closes its sessions and exits.
                if done[i] {
                    continue;
                }
                return Err(self.closed_early(i, "their reports"));
            };
            match parse_report_line(&line) {
                Some(ReportLine::Counts(c)) => counts[i] = Some(c),
                Some(ReportLine::Grant(record)) => records.push(record),
                Some(ReportLine::Done) => done[i] = true,
                None => eprintln!("crowd child {i}: {line}"),
            }
        }
        let counts = counts
            .into_iter()
            .enumerate()
            .map(|(i, c)| c.ok_or_else(|| invalid(format!("crowd child {i} reported no counts"))))
            .collect::<Result<_>>()?;
        Ok((counts, records))
    }

    /// Closes the children's input and waits for them to exit (killing
    /// those that do not within `within`).
    pub(super) fn finish(&mut self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        let mut failed = Vec::new();
        for (i, (child, stdin)) in self.procs.iter_mut().enumerate() {
            *stdin = None;
            loop {
                if let Some(status) = child.try_wait()? {
                    if !status.success() {
                        failed.push(format!("crowd child {i} exited with {status}"));
                    }
                    break;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    failed.push(format!("crowd child {i} did not exit; killed"));
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        match failed.is_empty() {
            true => Ok(()),
            false => Err(std::io::Error::other(failed.join("; "))),
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for (child, _) in &mut self.procs {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contenders_spread_evenly() {
        assert_eq!(shares(1000, 4), vec![250; 4]);
        assert_eq!(shares(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(shares(2, 4), vec![1, 1]);
        assert_eq!(shares(16, 1), vec![16]);
    }
}
