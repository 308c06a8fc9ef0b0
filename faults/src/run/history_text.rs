//! The history as text, one line per event, write and fault in time order
//! (`history.txt`, kept with the contenders' logs).

use std::fmt::Write as _;
use std::path::Path;

use crate::clock::secs;
use crate::history::{Fence, Record};
use crate::nemesis::Fault;

/// Writes the history, in time order, where the logs are kept.
pub(super) fn write_history(record: &Record, faults: &[Fault], run_start: u64, path: &Path) {
    let mut lines: Vec<(u64, String)> = event_lines(record)
        .chain(write_lines(record))
        .chain(fault_lines(faults))
        .collect();
    lines.sort_by_key(|(t, _)| *t);
    let mut text = String::new();
    for (t, line) in lines {
        let _ = writeln!(text, "{:10.3} {line}", secs(t.saturating_sub(run_start)));
    }
    let _ = std::fs::write(path, text);
}

/// Each contender's event, with its time.
fn event_lines(record: &Record) -> impl Iterator<Item = (u64, String)> + '_ {
    record.events.iter().map(|e| (e.t, format!("{} {:?}", e.tag, e.what)))
}

/// Each register write and its verdict, with its time.
fn write_lines(record: &Record) -> impl Iterator<Item = (u64, String)> + '_ {
    record.writes.iter().map(|w| {
        let verdict = match (w.accepted, w.fence) {
            (true, Fence::Token) => "accepted",
            (false, Fence::Token) => "REJECTED",
            (true, Fence::Held) => "committed",
            (false, Fence::Held) => "REFUSED (lock not held)",
        };
        (
            w.t,
            format!("{} write token {} seq {} {verdict}", w.tag, w.token, w.seq),
        )
    })
}

/// Each fault's beginning and, when it healed, its end.
fn fault_lines(faults: &[Fault]) -> impl Iterator<Item = (u64, String)> + '_ {
    faults.iter().flat_map(|f| {
        let mut both = vec![(f.start, format!("nemesis {} {} begins", f.kind, f.target))];
        if let Some(end) = f.end {
            both.push((end, format!("nemesis {} {} healed", f.kind, f.target)));
        }
        both
    })
}
