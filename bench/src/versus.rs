//! lockline against another client library on the same server: grants/s,
//! and the client's and the server's CPU time per grant, over one window.
//!
//! Every client runs the same workload: N contenders, each its own session
//! and connection, on one lock, zero hold time, all N in one process (lockline
//! in this one, a peer in a child process of its own). After a warm-up the
//! window starts; the server's CPU time (from `/proc/PID/stat` of the server
//! process) and the client process's are read at its start and end.
//!
//! A peer program speaks a small line protocol on its standard output: it
//! prints `ready` once its sessions are open, `measuring` when its warm-up is
//! over and its window starts, and `grants G seconds S cpu_ms C` when the
//! window ends (the grants made in the window, its length in seconds, and
//! the CPU time its own process spent in it). Its arguments are its own.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{BoxResult, Contenders};

/// One client's window.
#[derive(Debug, Clone, Copy, Default)]
pub struct Versus {
    /// Grants made in the window.
    pub grants: u64,
    /// The window's length.
    pub seconds: f64,
    /// The client process's CPU time in the window.
    pub client_cpu: Duration,
    /// The server process's CPU time in the window.
    pub server_cpu: Duration,
    /// The server process's read and write system calls in the window
    /// (`syscr` + `syscw` of `/proc/PID/io`), when they could be read.
    pub server_syscalls: Option<u64>,
}

impl Versus {
    /// Grants per second.
    pub fn grants_per_sec(&self) -> f64 {
        self.grants as f64 / self.seconds
    }

    /// The client's CPU milliseconds per grant.
    pub fn client_ms_per_grant(&self) -> f64 {
        self.client_cpu.as_secs_f64() * 1e3 / self.grants.max(1) as f64
    }

    /// The server's CPU milliseconds per grant.
    pub fn server_ms_per_grant(&self) -> f64 {
        self.server_cpu.as_secs_f64() * 1e3 / self.grants.max(1) as f64
    }

    /// The server's read and write system calls per grant (NaN when unknown).
    pub fn server_syscalls_per_grant(&self) -> f64 {
        self.server_syscalls
            .map_or(f64::NAN, |calls| calls as f64 / self.grants.max(1) as f64)
    }
}

/// The read and write system calls process `pid` has made so far (`syscr` +
/// `syscw` of `/proc/PID/io`); `None` when they cannot be read (another
/// user's process without the right to trace it).
pub fn process_syscalls(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    let field = |name: &str| {
        io.lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse::<u64>().ok())
    };
    Some(field("syscr:")? + field("syscw:")?)
}

/// The CPU time (user + system) process `pid` has used so far, from
/// `/proc/PID/stat`; `None` when it cannot be read. Counted in clock ticks
/// (10 ms on Linux): read it over windows of seconds.
pub fn process_cpu(pid: u32) -> Option<Duration> {
    cpu_of(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The CPU time this process has used so far (see [`process_cpu`]).
pub fn own_cpu() -> Option<Duration> {
    cpu_of(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// utime + stime from a `/proc/PID/stat` line (fields 14 and 15, counted
/// after the command name in parentheses, which may hold spaces).
fn cpu_of(stat: &str) -> Option<Duration> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Field 3 (state) is the first after the name: utime is field 14.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // The kernel's USER_HZ is 100 on every Linux this runs on.
    Some(Duration::from_millis(ticks * 10))
}

/// lockline's window: every contender of `contenders` takes and releases its
/// lock in a loop; after `warmup` seconds, `window` seconds are measured.
///
/// # Errors
///
/// A lock or release that failed, or a CPU time that could not be read.
pub async fn lockline(contenders: &Contenders, server_pid: u32, warmup: f64, window: f64) -> BoxResult<Versus> {
    let grants = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = contenders
        .mutexes()
        .iter()
        .cloned()
        .map(|mutex| {
            let (grants, stop) = (Arc::clone(&grants), Arc::clone(&stop));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let guard = mutex.lock().await?;
                    grants.fetch_add(1, Ordering::Relaxed);
                    guard.release().await?;
                }
                Ok::<_, lockline::Error>(())
            })
        })
        .collect();
    let measured = measure(server_pid, &grants, warmup, window).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await??;
    }
    measured
}

/// Measures a window of contenders running in this process that count their
/// grants in `grants`: waits `warmup` seconds, then reads the counts and the
/// CPU times at the start and the end of `window` seconds.
///
/// # Errors
///
/// A CPU time that could not be read.
pub async fn measure(server_pid: u32, grants: &AtomicU64, warmup: f64, window: f64) -> BoxResult<Versus> {
    tokio::time::sleep(Duration::from_secs_f64(warmup)).await;
    let start = snapshot(server_pid, grants.load(Ordering::Relaxed))?;
    tokio::time::sleep(Duration::from_secs_f64(window)).await;
    let end = snapshot(server_pid, grants.load(Ordering::Relaxed))?;
    Ok(Versus {
        grants: end.grants - start.grants,
        seconds: (end.at - start.at).as_secs_f64(),
        client_cpu: end.client - start.client,
        server_cpu: end.server - start.server,
        server_syscalls: end.syscalls.zip(start.syscalls).map(|(e, s)| e - s),
    })
}

struct Snapshot {
    at: Instant,
    grants: u64,
    client: Duration,
    server: Duration,
    syscalls: Option<u64>,
}

fn snapshot(server_pid: u32, grants: u64) -> BoxResult<Snapshot> {
    Ok(Snapshot {
        at: Instant::now(),
        grants,
        client: own_cpu().ok_or("cannot read this process's CPU time")?,
        server: process_cpu(server_pid).ok_or("cannot read the server's CPU time")?,
        syscalls: process_syscalls(server_pid),
    })
}

/// A peer's window: runs `command` (a peer program speaking the protocol in
/// the module docs) to its end, reading the server's CPU time when it says
/// `measuring` and when it prints its figures.
///
/// # Errors
///
/// The program could not start, exited early, or printed something else.
pub fn peer(mut command: Command, server_pid: u32) -> BoxResult<Versus> {
    let mut child = command.stdout(Stdio::piped()).stdin(Stdio::null()).spawn()?;
    let stdout = child.stdout.take().ok_or("no standard output")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut next = || -> BoxResult<String> { Ok(lines.next().ok_or("the peer program ended before its figures")??) };
    let result: BoxResult<Versus> = (|| {
        let ready = next()?;
        if ready != "ready" {
            return Err(format!("the peer program said {ready:?}, not ready").into());
        }
        let measuring = next()?;
        if measuring != "measuring" {
            return Err(format!("the peer program said {measuring:?}, not measuring").into());
        }
        let server_start = process_cpu(server_pid).ok_or("cannot read the server's CPU time")?;
        let syscalls_start = process_syscalls(server_pid);
        let figures = next()?;
        let server_end = process_cpu(server_pid).ok_or("cannot read the server's CPU time")?;
        let syscalls_end = process_syscalls(server_pid);
        let words: Vec<&str> = figures.split_whitespace().collect();
        let [_, grants, _, seconds, _, cpu_ms] = words[..] else {
            return Err(format!("the peer program's figures {figures:?} are not `grants G seconds S cpu_ms C`").into());
        };
        let bad = || format!("the peer program's figures {figures:?} do not parse");
        Ok(Versus {
            grants: grants.parse().map_err(|_| bad())?,
            seconds: seconds.parse().map_err(|_| bad())?,
            client_cpu: Duration::from_secs_f64(cpu_ms.parse::<f64>().map_err(|_| bad())? / 1e3),
            server_cpu: server_end - server_start,
            server_syscalls: syscalls_end.zip(syscalls_start).map(|(e, s)| e - s),
        })
    })();
    if result.is_err() {
        let _ = child.kill();
    }
    let status = child.wait()?;
    let versus = result?;
    if !status.success() {
        return Err(format!("the peer program failed: {status}").into());
    }
    Ok(versus)
}

#[cfg(test)]
mod tests {
    use super::cpu_of;
    use std::time::Duration;

    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        let stat = "1234 (a b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0";
        assert_eq!(cpu_of(stat), Some(Duration::from_millis(3000)));
        assert_eq!(cpu_of("garbage"), None);
        assert!(super::own_cpu().is_some());
        assert!(super::process_syscalls(std::process::id()).is_some());
    }
}
