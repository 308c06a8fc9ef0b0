//! Reading back the register's writes from the backend's own store (the
//! SQL databases' table, the lock-mode register's keys): settling the writes
//! whose commit got no answer, checking the answered ones against the
//! store, and finding stale writes committed after newer ones.

use std::collections::BTreeSet;

use crate::history::{Fence, History, Write};
use crate::nemesis::Fault;
use crate::servers::{Servers, StoredWrite};
use crate::Config;

/// Writes whose commit got no answer: the backend's store says whether they
/// landed. Returns how many were read back and what disagrees.
pub(super) fn read_back_writes(
    config: &Config,
    servers: &Servers,
    history: &History,
    faults: &[Fault],
    problems: &mut Vec<String>,
) -> (usize, Vec<String>) {
    let read = if config.modes {
        read_back_lock_store(config, servers, history, faults)
    } else {
        match servers.committed_writes() {
            Some(committed) => committed.map(|rows| read_back_database(history, &rows)),
            None => Ok((0, Vec::new())),
        }
    };
    read.unwrap_or_else(|error| {
        problems.push(error);
        (0, Vec::new())
    })
}

/// The lock-mode register: a key of the lock's own store per write.
fn read_back_lock_store(
    config: &Config,
    servers: &Servers,
    history: &History,
    faults: &[Fault],
) -> Result<(usize, Vec<String>), String> {
    let written: Vec<StoredWrite> = history
        .lock()
        .writes
        .iter()
        .filter(|w| w.fence == Fence::Held)
        .map(|w| (w.tag, w.token, w.seq))
        .collect();
    let stored = servers.stored_register(&written)?;
    let mut record = history.lock();
    let read_back = record.writes.iter().filter(|w| w.unsure).count();
    let mut disagreements = reconcile(
        &mut record.writes,
        &stored.rows,
        "the store",
        forgotten_before(config, faults),
    );
    if stored.ordered {
        disagreements.extend(committed_out_of_order(&stored.rows));
    }
    disagreements.extend(stored.divergent);
    Ok((read_back, disagreements))
}

/// A restart that forgets the data (Redis without persistence) forgets the
/// register's keys written before it: the end of the last such restart
/// (ns; 0 when there was none).
fn forgotten_before(config: &Config, faults: &[Fault]) -> u64 {
    faults
        .iter()
        .filter(|f| config.backend.forgets_data().contains(&f.kind))
        .filter_map(|f| f.end)
        .max()
        .unwrap_or(0)
}

/// The SQL databases' register: the rows of its table, in their commit
/// order.
fn read_back_database(history: &History, rows: &[StoredWrite]) -> (usize, Vec<String>) {
    let mut record = history.lock();
    let read_back = record.writes.iter().filter(|w| w.unsure).count();
    let mut disagreements = reconcile(&mut record.writes, rows, "the database", 0);
    disagreements.extend(committed_out_of_order(rows));
    (read_back, disagreements)
}

/// Settles the writes whose writer got no answer to its commit by what the
/// backend's store holds (`committed`: writer, token, seq; `place` names
/// it), and checks the answered ones against it. Returns what disagrees: a
/// write answered as committed that is not there, or one refused that is.
/// Writes made up to `forgotten_before` (ns) may be gone with a restart
/// that forgot the store's data (Redis without persistence): one answered
/// as committed and missing is no finding, and one unanswered stays
/// counted as landed.
fn reconcile(writes: &mut [Write], committed: &[StoredWrite], place: &str, forgotten_before: u64) -> Vec<String> {
    let mut problems = Vec::new();
    let stored: BTreeSet<_> = committed.iter().copied().collect();
    for write in writes.iter_mut().filter(|w| w.fence == Fence::Held) {
        let there = stored.contains(&(write.tag, write.token, write.seq));
        let forgotten = write.t <= forgotten_before;
        if write.unsure {
            if !forgotten || there {
                write.unsure = false;
                write.accepted = there;
            }
        } else if write.accepted && !there && !forgotten {
            problems.push(format!(
                "the write of {} with token {} (seq {}) was answered as committed but is not in {place}",
                write.tag, write.token, write.seq
            ));
        } else if !write.accepted && there {
            problems.push(format!(
                "the write of {} with token {} (seq {}) was refused (lock not held) but is in {place}",
                write.tag, write.token, write.seq
            ));
        }
    }
    problems
}

/// The register's rows in the server's order (PostgreSQL: of their
/// commits; MariaDB: of their inserts): a token below one committed before
/// it is a stale holder's write landing after a newer holder's, whatever
/// the writers' clocks said (the fence must have refused it); and one
/// inserted after a newer holder's committed write was made by a holder
/// that was stale by then, so its commit must have been refused. Returns
/// each such write.
fn committed_out_of_order(committed: &[StoredWrite]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut highest: Option<&StoredWrite> = None;
    for write in committed {
        match highest {
            Some(before) if write.1 < before.1 => problems.push(format!(
                "the write of {} with token {} (seq {}) committed after the write of {} with token {} (seq {})",
                write.0, write.1, write.2, before.0, before.1, before.2
            )),
            _ => highest = Some(write),
        }
    }
    problems
}
#[cfg(test)]
mod tests {
    use super::{committed_out_of_order, reconcile};
    use crate::history::{Fence, Tag, Write};

    /// The one writer of these tests.
    const WRITER: Tag = Tag {
        slot: 0,
        incarnation: 0,
    };

    fn write(seq: u64, accepted: bool, unsure: bool, fence: Fence) -> Write {
        Write {
            t: seq,
            tag: WRITER,
            token: 7,
            seq,
            accepted,
            fence,
            unsure,
        }
    }

    #[test]
    fn unanswered_writes_are_settled_by_the_store_and_answered_ones_checked_against_it() {
        let tag = WRITER;
        let mut writes = vec![
            write(0, true, false, Fence::Held),  // committed, stored: fine
            write(1, true, true, Fence::Held),   // unsure, stored: landed
            write(2, true, true, Fence::Held),   // unsure, not stored: did not land
            write(3, true, false, Fence::Held),  // committed, not stored: lost
            write(4, false, false, Fence::Held), // refused, stored: landed anyway
            write(5, true, false, Fence::Token), // the test's register: not in the store
        ];
        let stored = [(tag, 7, 0), (tag, 7, 1), (tag, 7, 4)];
        let problems = reconcile(&mut writes, &stored, "the database", 0);
        let settled: Vec<(bool, bool)> = writes.iter().map(|w| (w.accepted, w.unsure)).collect();
        assert_eq!(
            settled,
            [
                (true, false),
                (true, false),
                (false, false),
                (true, false),
                (false, false),
                (true, false)
            ]
        );
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("seq 3") && problems[0].contains("not in the database"));
        assert!(problems[1].contains("seq 4") && problems[1].contains("refused"));
    }

    #[test]
    fn writes_a_restart_forgot_are_not_held_against_the_store() {
        let tag = WRITER;
        // Up to t = 2 the store's data was forgotten by a restart.
        let mut writes = vec![
            write(1, true, false, Fence::Held), // committed, forgotten: fine
            write(2, true, true, Fence::Held),  // unsure, forgotten: still counted as landed
            write(3, true, false, Fence::Held), // committed after the restart, missing: lost
            write(4, true, true, Fence::Held),  // unsure after the restart, there: landed
        ];
        let stored = [(tag, 7, 4)];
        let problems = reconcile(&mut writes, &stored, "the store", 2);
        let settled: Vec<(bool, bool)> = writes.iter().map(|w| (w.accepted, w.unsure)).collect();
        assert_eq!(settled, [(true, false), (true, true), (true, false), (true, false)]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("seq 3") && problems[0].contains("not in the store"));
    }

    #[test]
    fn a_stale_write_committed_after_a_newer_one_is_caught() {
        let tag = |slot| Tag { slot, incarnation: 0 };
        let in_order = [(tag(0), 5, 1), (tag(0), 5, 2), (tag(1), 6, 1), (tag(2), 8, 1)];
        assert_eq!(committed_out_of_order(&in_order), Vec::<String>::new());
        let stale = [(tag(0), 5, 1), (tag(1), 6, 1), (tag(0), 5, 2), (tag(1), 6, 2)];
        let found = committed_out_of_order(&stale);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("token 5 (seq 2) committed after"), "{found:?}");
    }
}
