//! Winding the contenders down once the nemesis is done: stop them (they
//! release, cancel and clean up), look for entries of live sessions, close
//! their sessions, and wait for every entry to go.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::fleet::Fleet;
use crate::history::{History, Tag, What};
use crate::servers::Servers;
use crate::Config;

use super::{say, LOCK};

/// Stops every running contender: it releases, cancels, and waits for its
/// cleanup. Returns the contenders that were running.
pub(super) fn stop_contenders(
    config: &Config,
    fleet: &mut Fleet,
    history: &History,
    problems: &mut Vec<String>,
) -> Vec<usize> {
    say(config, "stopping the contenders");
    let running: Vec<usize> = (0..config.contenders).filter(|&s| fleet.is_running(s)).collect();
    let tags: Vec<_> = running.iter().map(|&s| fleet.slots[s].tag).collect();
    // A contender just restarted may not be listening for SIGTERM yet.
    history.wait_until(Duration::from_secs(10), |r| tags.iter().all(|t| r.started.contains(t)));
    for &slot in &running {
        let _ = fleet.signal(slot, libc::SIGTERM);
    }
    let idle_deadline = config.ttl * 4 + Duration::from_secs(15);
    history.wait_until(idle_deadline, |r| tags.iter().all(|t| r.idle.contains(t)));
    let idle: Vec<_> = history.lock().idle.clone();
    for &slot in &running {
        let tag = fleet.slots[slot].tag;
        if !idle.contains(&tag) {
            problems.push(format!(
                "{tag} did not stop within {idle_deadline:?} of SIGTERM; log: {}",
                fleet.log_tail(slot, 1500)
            ));
            let _ = fleet.kill(slot);
        }
    }

    running
}

/// Orphans of live sessions: the idle contenders' own sessions hold nothing.
pub(super) fn live_orphans(servers: &Servers, history: &History, problems: &mut Vec<String>) -> Vec<String> {
    let sessions = live_sessions(history);
    let mut orphans = Vec::new();
    match servers.entries(LOCK) {
        Ok(entries) => {
            for entry in entries {
                if let Some(tag) = sessions.get(&entry.owner) {
                    orphans.push(format!(
                        "{} owned by the live session {} of {tag}, which holds and waits for nothing",
                        entry.key, entry.owner
                    ));
                }
            }
        }
        Err(error) => problems.push(format!("listing entries: {error}")),
    }

    orphans
}

/// Closes every contender's session and lets it exit.
pub(super) fn close_contenders(running: &[usize], fleet: &mut Fleet, history: &History, problems: &mut Vec<String>) {
    let tags: Vec<_> = running.iter().map(|&s| fleet.slots[s].tag).collect();
    for &slot in running {
        fleet.close_input(slot);
    }
    history.wait_until(Duration::from_secs(15), |r| tags.iter().all(|t| r.closed.contains(t)));
    let closed: Vec<_> = history.lock().closed.clone();
    for &slot in running {
        let tag = fleet.slots[slot].tag;
        if closed.contains(&tag) {
            fleet.wait(slot);
        } else if fleet.is_running(slot) {
            problems.push(format!("{tag} did not close its session within 15 s"));
            let _ = fleet.kill(slot);
        }
    }
}

/// Nothing may remain once killed contenders' sessions have expired: the
/// entries still there.
pub(super) fn entries_left(
    config: &Config,
    servers: &Servers,
    history: &History,
    problems: &mut Vec<String>,
) -> Vec<String> {
    let mut orphans = Vec::new();
    let deadline = Instant::now() + config.ttl * 2 + Duration::from_secs(5);
    let left = loop {
        match servers.entries(LOCK) {
            Ok(entries) if entries.is_empty() => break Vec::new(),
            Ok(entries) if Instant::now() > deadline => break entries,
            Ok(_) => {}
            Err(error) if Instant::now() > deadline => {
                problems.push(format!("listing entries: {error}"));
                break Vec::new();
            }
            Err(_) => {}
        }
        // The servers expire sessions on their own clock: no event to await here.
        std::thread::sleep(Duration::from_millis(200));
    };
    let owners = all_sessions(history);
    for entry in &left {
        let owner = owners
            .get(&entry.owner)
            .map_or("no contender".to_owned(), |t| t.to_string());
        orphans.push(format!(
            "{} owned by session {} ({owner}) still there {:?} after every contender exited",
            entry.key,
            entry.owner,
            config.ttl * 2 + Duration::from_secs(5)
        ));
    }
    orphans
}
/// Each contender's current session (opened and not given up), by id.
fn live_sessions(history: &History) -> BTreeMap<String, Tag> {
    let record = history.lock();
    let mut live = BTreeMap::new();
    let mut events: Vec<_> = record.events.iter().collect();
    events.sort_by_key(|e| e.t);
    for event in events {
        match &event.what {
            What::Session { id } => {
                live.insert(id.clone(), event.tag);
            }
            What::SessionOver { id } => {
                live.remove(id);
            }
            What::Killed | What::Exited => live.retain(|_, tag| *tag != event.tag),
            _ => {}
        }
    }
    live
}

/// Every session any contender opened, by id.
fn all_sessions(history: &History) -> BTreeMap<String, Tag> {
    history
        .lock()
        .events
        .iter()
        .filter_map(|e| match &e.what {
            What::Session { id } => Some((id.clone(), e.tag)),
            _ => None,
        })
        .collect()
}
