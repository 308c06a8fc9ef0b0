use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::Result;

/// A helper program (`etcdctl lock`, a kazoo script) whose standard output is
/// read line by line in the background; killed on drop.
#[derive(Debug)]
pub struct LineChild {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl LineChild {
    /// Starts `command` with piped stdin and stdout (stderr inherited).
    ///
    /// # Errors
    ///
    /// When the program cannot be started.
    pub fn spawn(mut command: Command) -> Result<Self> {
        let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
        let stdout = child.stdout.take().ok_or_else(|| std::io::Error::other("no stdout"))?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(std::result::Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Ok(LineChild { child, stdin, lines })
    }

    /// The next line the program prints, if one comes within `within`.
    pub fn line(&self, within: Duration) -> Option<String> {
        self.lines.recv_timeout(within).ok()
    }

    /// The program's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal (`libc::SIGSTOP`, `libc::SIGCONT`, ...) without waiting.
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent.
    pub fn signal(&self, signal: libc::c_int) -> Result<()> {
        let pid = libc::pid_t::try_from(self.child.id()).map_err(std::io::Error::other)?;
        // SAFETY: kill(2) on our own child.
        if unsafe { libc::kill(pid, signal) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Writes `line` and a newline to the program's standard input.
    ///
    /// # Errors
    ///
    /// When its standard input is closed or the write fails.
    pub fn send_line(&mut self, line: &str) -> Result<()> {
        use std::io::Write;
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| std::io::Error::other("standard input is closed"))?;
        writeln!(stdin, "{line}")?;
        stdin.flush()
    }

    /// Closes the program's standard input.
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Sends a signal (`libc::SIGINT`, ...) and waits for the program to exit.
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent or the program not reaped.
    pub fn signal_and_wait(&mut self, signal: libc::c_int) -> Result<()> {
        let pid = libc::pid_t::try_from(self.child.id()).map_err(std::io::Error::other)?;
        // SAFETY: kill(2) on our own child.
        if unsafe { libc::kill(pid, signal) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        self.wait()
    }

    /// Waits for the program to exit.
    ///
    /// # Errors
    ///
    /// When it cannot be reaped.
    pub fn wait(&mut self) -> Result<()> {
        self.child.wait().map(|_| ())
    }
}

impl Drop for LineChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
