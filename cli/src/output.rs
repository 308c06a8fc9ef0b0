//! What `lockline` writes: the held key, a queue's listing and an election's
//! leaders on standard output, and diagnostics on standard error.
//!
//! Both are written by a thread of their own, fed through a bounded queue, so
//! that nothing `lockline` does for the lock or the command ever waits on, or
//! depends on, its output: a closed pipe, a full disk (`/dev/full`) or a
//! reader that stopped reading costs at most the lines that could not be
//! written. Write errors are ignored (a failure to print the key is reported
//! on standard error); lines that find the queue full are dropped.
//!
//! Diagnostics never show a password `lockline` was given: each one (see
//! [`hide`]) is replaced by `***` in every diagnostic, whoever wrote the
//! message (a backend's error included).

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

/// How many lines may wait for the writer before new ones are dropped.
const QUEUE: usize = 64;

enum Line {
    /// The held key, for standard output.
    Key(String),
    /// Other output (a listing, a leader), written as is on standard output.
    Output(Vec<u8>),
    /// A diagnostic, for standard error.
    Diagnostic(String),
    /// Answers once every line queued before it has been written (or failed).
    Flush(SyncSender<()>),
}

/// The queue to the writer thread; `None` when the thread could not start,
/// and output is then dropped.
static WRITER: OnceLock<Option<SyncSender<Line>>> = OnceLock::new();

fn writer() -> Option<&'static SyncSender<Line>> {
    WRITER
        .get_or_init(|| {
            let (lines, queue) = mpsc::sync_channel(QUEUE);
            std::thread::Builder::new()
                .name("lockline-output".into())
                .spawn(move || write_lines(&queue))
                .ok()?;
            Some(lines)
        })
        .as_ref()
}

fn send(line: Line) {
    if let Some(writer) = writer() {
        // Full (the writer is stuck) or gone: the line is dropped.
        let _ = writer.try_send(line);
    }
}

/// Queues `key` for standard output, never waiting.
pub(crate) fn key(key: &str) {
    send(Line::Key(key.to_owned()));
}

/// Queues `bytes` for standard output as they are, never waiting. A failed
/// write is not reported line by line: [`stdout_failed`] resolves.
pub(crate) fn output(bytes: Vec<u8>) {
    send(Line::Output(bytes));
}

/// Set once a write of [`output`] to standard output failed (a reader that
/// went away, `lockline elect -l NAME | head -2`).
static STDOUT_FAILED: AtomicBool = AtomicBool::new(false);
static STDOUT_FAILED_NOTIFY: Notify = Notify::const_new();

/// Whether a write of [`output`] to standard output has failed.
pub(crate) fn stdout_has_failed() -> bool {
    STDOUT_FAILED.load(Ordering::Acquire)
}

/// Resolves once a write of [`output`] to standard output has failed.
///
/// # Cancel safety
///
/// Cancel safe.
pub(crate) async fn stdout_failed() {
    loop {
        let notified = STDOUT_FAILED_NOTIFY.notified();
        if STDOUT_FAILED.load(Ordering::Acquire) {
            return;
        }
        notified.await;
    }
}

/// The passwords `lockline` was given, longest first.
static SECRETS: OnceLock<Vec<String>> = OnceLock::new();

/// From now on, every diagnostic shows `***` in place of each of `secrets`
/// (the empty ones are ignored). Only the first call counts.
pub(crate) fn hide(secrets: Vec<String>) {
    let mut secrets: Vec<String> = secrets.into_iter().filter(|s| !s.is_empty()).collect();
    secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    secrets.dedup();
    let _ = SECRETS.set(secrets);
}

/// `text` with every secret given to [`hide`] replaced by `***`.
fn without_secrets(mut text: String) -> String {
    for secret in SECRETS.get().into_iter().flatten() {
        if text.contains(secret.as_str()) {
            text = text.replace(secret.as_str(), "***");
        }
    }
    text
}

/// Queues a diagnostic line for standard error, never waiting; `note!` calls
/// it.
pub(crate) fn diagnostic(text: fmt::Arguments<'_>) {
    send(Line::Diagnostic(without_secrets(text.to_string())));
}

/// Waits at most `within` for the lines queued so far to be written, so that
/// they are not cut off by the exit.
pub(crate) fn finish(within: Duration) {
    // Nothing was ever written: there is no writer to wait for.
    let Some(Some(writer)) = WRITER.get() else {
        return;
    };
    let (done, flushed) = mpsc::sync_channel(1);
    if writer.try_send(Line::Flush(done)).is_ok() {
        let _ = flushed.recv_timeout(within);
    }
}

/// The writer thread: writes each line, ignoring failures.
fn write_lines(queue: &Receiver<Line>) {
    for line in queue {
        match line {
            Line::Key(key) => {
                let mut stdout = io::stdout().lock();
                if let Err(error) = writeln!(stdout, "{key}").and_then(|()| stdout.flush()) {
                    let _ = writeln!(
                        io::stderr().lock(),
                        "lockline: cannot print the held key {key} on standard output: {error}"
                    );
                }
            }
            Line::Output(bytes) => {
                let mut stdout = io::stdout().lock();
                if stdout.write_all(&bytes).and_then(|()| stdout.flush()).is_err() {
                    STDOUT_FAILED.store(true, Ordering::Release);
                    STDOUT_FAILED_NOTIFY.notify_waiters();
                }
            }
            Line::Diagnostic(text) => {
                let _ = writeln!(io::stderr().lock(), "{text}");
            }
            Line::Flush(done) => {
                let _ = done.try_send(());
            }
        }
    }
}

/// `at` in UTC as RFC 3339 with milliseconds (`2025-06-01T12:00:03.250Z`),
/// as `list` shows the end of a lock-delay: readable, sortable, and read by
/// `date -d`.
pub(crate) fn utc(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, of_day) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days, for days since 1970-01-01.
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era = (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3_600,
        of_day / 60 % 60,
        of_day % 60,
        since.subsec_millis()
    )
}

/// Writes a diagnostic line on standard error through the output thread;
/// never waits, never fails, never panics.
macro_rules! note {
    ($($arg:tt)*) => {
        $crate::output::diagnostic(format_args!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::utc;

    #[test]
    fn utc_is_rfc_3339_with_milliseconds() {
        let at = |secs: u64, millis: u64| utc(UNIX_EPOCH + Duration::from_millis(secs * 1_000 + millis));
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        // `date -u -d @951782400`: the leap day of a century's leap year.
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(at(1_709_251_199, 999), "2024-02-29T23:59:59.999Z");
        assert_eq!(at(1_735_689_600, 250), "2025-01-01T00:00:00.250Z");
        assert_eq!(at(4_102_444_799, 0), "2099-12-31T23:59:59.000Z");
    }
}
