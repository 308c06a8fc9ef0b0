//! A crowd on one lock: many contenders, spread over several processes.
//!
//! The harness deals in processes, arguments and lines, so that it needs no
//! lock library: a crowd example re-runs its own executable
//! ([`std::env::current_exe`]) as P child processes, each started with
//! [`CHILD_FLAG`], its share of the contenders, the run's number and the
//! example's own arguments (a server address, say). Each child opens its
//! contenders (each its own client and session) and then follows the parent,
//! line by line on its standard input and output:
//!
//! | child says | parent answers | when |
//! |---|---|---|
//! | `ready` | `go` (to all) | every child has its sessions |
//! | `queued` | `window START END` (to all) | every contender of every child has appended an entry |
//! | `counts G W R`, `grant TOKEN GRANTED RELEASE_STARTED` ..., `done` | | after END |
//!
//! Times are nanoseconds since the UNIX epoch ([`unix_nanos`]):
//! `CLOCK_REALTIME` is one clock for every process on a machine. `counts`
//! are the grants, wakeups and releases the child's clients counted within
//! the window; each `grant` line is one grant within the window: its fencing
//! token, when `lock()` returned, and when its holder began to release.
//!
//! The parent merges every child's grants, sorts them by token (a FIFO lock
//! grants in token order), and takes each handoff's latency as the next
//! grant's time minus the previous holder's release start. Holds that
//! overlap (a grant before its predecessor began to release) are counted:
//! they would be a broken lock, or clocks that disagree.

//!
//! Its parts: the protocol's lines (`protocol`), the child's end
//! ([`CrowdChild`]), the parent's end (`children`), the merge into one
//! run's figures ([`CrowdResult`]), the examples' options ([`CrowdArgs`])
//! and the plan they run and print ([`run_plan`]).

mod args;
mod child;
mod children;
mod merge;
mod plan;
mod protocol;

use std::time::Duration;

pub use self::args::CrowdArgs;
pub use self::child::CrowdChild;
pub use self::merge::CrowdResult;
pub use self::plan::{run_plan, run_plan_with, ExtraColumns, NoExtraColumns};
pub use self::protocol::{unix_nanos, CrowdCounts, GrantRecord, Window};

use self::children::Children;
use self::merge::merge;

type Result<T> = std::io::Result<T>;

/// The first argument of a child process.
pub const CHILD_FLAG: &str = "--crowd-child";

/// How long children may take to open their sessions, and to queue.
const SETUP_TIMEOUT: Duration = Duration::from_secs(180);

/// How long after the window children may take to report, and to exit.
const REPORT_TIMEOUT: Duration = Duration::from_secs(120);

/// From the parent's `window` line to the window's start.
const WINDOW_LEAD: Duration = Duration::from_millis(500);

fn invalid(message: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message.into())
}

/// One crowd run: `contenders` spread over `processes` children of this
/// program, measured for `seconds` once all have queued.
#[derive(Debug, Clone)]
pub struct Crowd {
    /// Child processes.
    pub processes: usize,
    /// Contenders over all of them.
    pub contenders: usize,
    /// The run's number, passed to each child ([`CrowdChild::run`]).
    pub run: usize,
    /// The window's length.
    pub seconds: f64,
    /// Arguments passed on to each child ([`CrowdChild::args`]).
    pub args: Vec<String>,
}

impl Crowd {
    /// Starts the children, measures, merges their reports and waits for
    /// them to exit.
    ///
    /// # Errors
    ///
    /// When a child cannot be started, exits early or does not keep to the
    /// protocol in time (the children are killed).
    pub fn run(&self) -> Result<CrowdResult> {
        let mut children = Children::spawn(self)?;
        children.expect_all("ready", SETUP_TIMEOUT)?;
        children.tell_all("go")?;
        children.expect_all("queued", SETUP_TIMEOUT)?;
        let window = self.window_from_now();
        children.tell_all(&format!("window {} {}", window.start_ns, window.end_ns))?;
        let (counts, records) = children.reports(window.until_end() + REPORT_TIMEOUT)?;
        children.finish(REPORT_TIMEOUT)?;
        let merged = merge(records, window);
        Ok(CrowdResult {
            processes: children.procs.len(),
            contenders: self.contenders,
            seconds: window.seconds(),
            counts: counts.into_iter().fold(CrowdCounts::default(), CrowdCounts::add),
            granted: merged.granted,
            handoff: merged.handoff,
            overlaps: merged.overlaps,
            duplicate_tokens: merged.duplicate_tokens,
        })
    }

    /// The measured window: `seconds` long, starting [`WINDOW_LEAD`] from
    /// now.
    fn window_from_now(&self) -> Window {
        let start_ns = unix_nanos() + WINDOW_LEAD.as_nanos() as u64;
        Window {
            start_ns,
            end_ns: start_ns + Duration::from_secs_f64(self.seconds).as_nanos() as u64,
        }
    }
}
