//! The history of a run and the fenced register, both kept by the harness.
//!
//! Contenders connect over loopback TCP and send lines:
//!
//! - `E <tag> <time> <kind> [fields...]`: an event the contender saw, stamped
//!   with its own reading of the shared monotonic clock (`started`, `session <id>`,
//!   `session-over <id>`, `wait <lock|timeout>`, `grant <token> <key>`,
//!   `lost <token>`, `release <token> <release|drop>`, `released <token> <ok|error>`,
//!   `timeout`, `error <text>`, `idle`, `closed`); a contender of a lock-mode
//!   resource (`--modes`) reports `grant-mode <MODE> <token> <key>` instead
//!   of `grant`, `converting <from> <to>` when it asks for an up-conversion,
//!   `convert <from> <to> <token>` when the mode it holds in changes (a
//!   down-conversion as it asks, for it stops using the stronger mode then;
//!   an up-conversion once granted), and `deadlock <from> <to>` or
//!   `convert-timeout <from> <to>` when an up-conversion fails and it keeps
//!   the mode it held;
//! - `W <tag> <token> <seq>`: a write to the fenced register, answered `OK` or
//!   `REJECT <highest>`. The register accepts a token at least as high as the
//!   highest it accepted, and stamps the write when it decides. An answer
//!   ending in ` stay` asks the holder to keep holding (the nemesis is about
//!   to fault it and wants it to be still holding when the fault bites);
//! - `F <tag> <time> <token> <seq> <ok|refused|unsure|failed>`: a write the
//!   backend itself fenced (on PostgreSQL, a row inserted in a
//!   `FencedTransaction`, which commits only while the lock is held), with
//!   the contender's time just before it asked to commit and what the commit
//!   answered (`unsure`: no answer, resolved later from the database; `failed`:
//!   it never got as far as committing, and is not recorded). Answered `OK`,
//!   with ` stay` as above;
//! - `S <tag>`: a holder that does not write (a lock-mode holder in NL, CR,
//!   CW or PR) checks in while it holds, answered `OK`, with ` stay` as above.
//!
//! The harness adds its own events (spawn, kill, pause, blackhole, ...) with
//! the same clock. A condition variable lets the harness await events (a grant,
//! every contender idle) instead of sleeping.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{BufRead, BufReader, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use lockline::LockMode;

use crate::clock::now_ns;

/// One contender process: its slot (0..N) and incarnation (restarts count up).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tag {
    /// Which contender.
    pub slot: usize,
    /// Which process of that contender (0 first, 1 after a restart, ...).
    pub incarnation: usize,
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}.{}", self.slot, self.incarnation)
    }
}

impl std::str::FromStr for Tag {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("bad contender tag {s:?}");
        let rest = s.strip_prefix('c').ok_or_else(bad)?;
        let (slot, incarnation) = rest.split_once('.').ok_or_else(bad)?;
        Ok(Tag {
            slot: slot.parse().map_err(|_| bad())?,
            incarnation: incarnation.parse().map_err(|_| bad())?,
        })
    }
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    /// The harness started the process.
    Spawned {
        /// Its process id.
        pid: u32,
    },
    /// The contender is up and stops cleanly on SIGTERM from now on.
    Started,
    /// The contender opened a session (etcd lease / ZooKeeper session id, hex).
    Session {
        /// The session id.
        id: String,
    },
    /// The contender gave a session up (it was over) and will open another.
    SessionOver {
        /// The session id.
        id: String,
    },
    /// The contender started an acquire.
    Waiting,
    /// `lock()` returned a guard.
    Grant {
        /// The fencing token.
        token: u64,
        /// The entry's key or path.
        key: String,
        /// The mode a lock-mode resource was granted in; `None` for a mutex
        /// (which excludes every other holder, as EX does).
        mode: Option<LockMode>,
    },
    /// A lock-mode holder asked for an up-conversion (it holds `from` while it waits).
    Converting {
        /// The mode held.
        from: LockMode,
        /// The mode asked for.
        to: LockMode,
    },
    /// The mode a lock-mode holder holds in changed: a down-conversion as
    /// it was asked for (the holder no longer uses `from` from then on), an
    /// up-conversion once granted.
    Converted {
        /// The mode it held.
        from: LockMode,
        /// The mode it holds now.
        to: LockMode,
        /// Its fencing token now (fresh after an up-conversion to CW, PW or EX).
        token: u64,
    },
    /// An up-conversion failed with `Error::Deadlock`; the holder keeps `from`.
    Deadlock {
        /// The mode held (and kept).
        from: LockMode,
        /// The mode asked for.
        to: LockMode,
    },
    /// `convert_timeout` ran out; the holder keeps `from`.
    ConvertTimeout {
        /// The mode held (and kept).
        from: LockMode,
        /// The mode asked for.
        to: LockMode,
    },
    /// The guard's `lost()` resolved.
    Lost {
        /// The lost grant's token.
        token: u64,
    },
    /// The contender stops using the lock: it calls `release()` or drops the guard.
    Release {
        /// The grant's token.
        token: u64,
        /// Dropped (background release) rather than `release()`d.
        dropped: bool,
    },
    /// `release()` returned.
    Released {
        /// The grant's token.
        token: u64,
        /// Whether `release()` returned `Ok`.
        ok: bool,
    },
    /// `lock_timeout` ran out.
    Timeout,
    /// An acquire or session failed.
    Error {
        /// What failed, as the contender said it.
        message: String,
    },
    /// Told to stop: holds nothing, waits for nothing, background cleanup done.
    Idle,
    /// Its session is closed; it exits.
    Closed,
    /// The harness froze the process (SIGSTOP).
    Paused,
    /// The harness thawed it (SIGCONT).
    Resumed,
    /// The harness killed it (SIGKILL).
    Killed,
    /// The harness cut its connections silently.
    Blackholed,
    /// The harness healed its connections.
    Healed,
    /// The process exited on its own.
    Exited,
}

/// An event of the history.
#[derive(Debug, Clone)]
pub struct Event {
    /// When, on the shared monotonic clock (ns).
    pub t: u64,
    /// Which contender process.
    pub tag: Tag,
    /// What.
    pub what: What,
}

/// What decided whether a write landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// The test's register, by token: it accepts a token at least as high as
    /// the highest it accepted. A stale holder's write accepted before any
    /// newer holder wrote is ordered, not overlapping.
    Token,
    /// The backend, by the lock itself: the write commits only if the lock is
    /// still held when it commits (lockline-sql's `FencedTransaction`). No
    /// write of a stale holder may land once the next holder was granted.
    Held,
}

/// A write the register (or the backend's fence) decided on.
#[derive(Debug, Clone)]
pub struct Write {
    /// When the register decided (ns); for a [`Fence::Held`] write, the
    /// writer's time just before it asked to commit (the decision came later).
    pub t: u64,
    /// Who wrote.
    pub tag: Tag,
    /// With which fencing token.
    pub token: u64,
    /// The writer's sequence number for this grant.
    pub seq: u64,
    /// Whether it was accepted.
    pub accepted: bool,
    /// What decided.
    pub fence: Fence,
    /// The writer got no answer to its commit: whether it landed is read back
    /// from the backend's store before the check (counted as accepted until then).
    pub unsure: bool,
}

/// Everything recorded so far.
#[derive(Debug, Default)]
pub struct Record {
    /// Events in the order they were recorded (sort by `t` to analyse).
    pub events: Vec<Event>,
    /// Register writes in the order the register decided them.
    pub writes: Vec<Write>,
    /// The highest token the register accepted.
    pub highest: u64,
    /// Who holds the lock now, as far as the contenders told: tag → token.
    pub holders: BTreeMap<Tag, u64>,
    /// Contenders that are up (SIGTERM stops them cleanly).
    pub started: Vec<Tag>,
    /// Contenders that are idle (after being told to stop).
    pub idle: Vec<Tag>,
    /// Contenders that closed their session.
    pub closed: Vec<Tag>,
    /// Lines that could not be parsed (a harness or contender bug).
    pub garbled: Vec<String>,
    /// Holders the nemesis wants to keep holding (told so in the register's answers).
    pub stay: Vec<Tag>,
    /// When each holder that does not write last checked in (`S`), on the
    /// register's clock.
    pub checked_in: BTreeMap<Tag, u64>,
}

impl Record {
    /// The last grant's time, if any.
    pub fn last_grant(&self) -> Option<u64> {
        self.events
            .iter()
            .filter(|e| matches!(e.what, What::Grant { .. }))
            .map(|e| e.t)
            .max()
    }
}

/// The shared history, its condition variable, and the register server.
#[derive(Debug, Clone)]
pub struct History {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    record: Mutex<Record>,
    changed: Condvar,
    stopped: AtomicBool,
}

impl History {
    /// Starts the register server on a free loopback port; returns the history
    /// and the server's address.
    ///
    /// # Errors
    ///
    /// When no port can be bound.
    pub fn start() -> std::io::Result<(History, String)> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?.to_string();
        let history = History { shared: Arc::default() };
        let server = history.clone();
        thread::Builder::new()
            .name("faults-register".into())
            .spawn(move || server.accept(listener))?;
        Ok((history, address))
    }

    /// Stops accepting (open connections end when their contenders exit).
    pub fn stop(&self, address: &str) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(address);
    }

    /// The record, locked.
    pub fn lock(&self) -> MutexGuard<'_, Record> {
        self.shared.record.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a harness event now.
    pub fn note(&self, tag: Tag, what: What) {
        self.note_at(now_ns(), tag, what);
    }

    /// Records a harness event that happened at `t`.
    pub fn note_at(&self, t: u64, tag: Tag, what: What) {
        self.push(Event { t, tag, what });
    }

    fn push(&self, event: Event) {
        let mut record = self.lock();
        match &event.what {
            What::Grant { token, .. } => {
                record.holders.insert(event.tag, *token);
            }
            What::Lost { .. } | What::Release { .. } | What::Killed | What::Exited => {
                record.holders.remove(&event.tag);
            }
            What::Started => record.started.push(event.tag),
            What::Idle => record.idle.push(event.tag),
            What::Closed => record.closed.push(event.tag),
            _ => {}
        }
        record.events.push(event);
        drop(record);
        self.shared.changed.notify_all();
    }

    /// Waits until `done` holds for the record, or `timeout` passes; returns
    /// whether it held.
    pub fn wait_until(&self, timeout: Duration, mut done: impl FnMut(&Record) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut record = self.lock();
        loop {
            if done(&record) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            record = self
                .shared
                .changed
                .wait_timeout(record, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn accept(self, listener: TcpListener) {
        for stream in listener.incoming() {
            if self.shared.stopped.load(Ordering::SeqCst) {
                return;
            }
            let Ok(stream) = stream else { continue };
            let history = self.clone();
            let _ = thread::Builder::new()
                .name("faults-connection".into())
                .spawn(move || history.serve(stream));
        }
    }

    fn serve(self, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let Ok(mut reply) = stream.try_clone() else { return };
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { return };
            if let Some(rest) = line.strip_prefix("W ") {
                let Some(answer) = self.write(rest) else {
                    self.lock().garbled.push(line);
                    return;
                };
                if reply.write_all(answer.as_bytes()).is_err() {
                    return;
                }
            } else if let Some(rest) = line.strip_prefix("F ") {
                let Some(answer) = self.fenced(rest) else {
                    self.lock().garbled.push(line);
                    return;
                };
                if reply.write_all(answer.as_bytes()).is_err() {
                    return;
                }
            } else if let Some(rest) = line.strip_prefix("S ") {
                let Some(answer) = self.check_in(rest) else {
                    self.lock().garbled.push(line);
                    return;
                };
                if reply.write_all(answer.as_bytes()).is_err() {
                    return;
                }
            } else if let Some(rest) = line.strip_prefix("E ") {
                match parse_event(rest) {
                    Some(event) => self.push(event),
                    None => self.lock().garbled.push(line),
                }
            } else {
                self.lock().garbled.push(line);
            }
        }
    }

    /// The fenced register: accept a token at least as high as the highest accepted.
    fn write(&self, rest: &str) -> Option<String> {
        let mut fields = rest.split(' ');
        let tag: Tag = fields.next()?.parse().ok()?;
        let token: u64 = fields.next()?.parse().ok()?;
        let seq: u64 = fields.next()?.parse().ok()?;
        let mut record = self.lock();
        let accepted = token >= record.highest;
        if accepted {
            record.highest = token;
        }
        let highest = record.highest;
        record.writes.push(Write {
            t: now_ns(),
            tag,
            token,
            seq,
            accepted,
            fence: Fence::Token,
            unsure: false,
        });
        let stay = if record.stay.contains(&tag) { " stay" } else { "" };
        drop(record);
        self.shared.changed.notify_all();
        Some(if accepted {
            format!("OK{stay}\n")
        } else {
            format!("REJECT {highest}{stay}\n")
        })
    }

    /// A write the backend fenced: recorded as the contender saw it decided.
    fn fenced(&self, rest: &str) -> Option<String> {
        let mut fields = rest.split(' ');
        let tag: Tag = fields.next()?.parse().ok()?;
        let t: u64 = fields.next()?.parse().ok()?;
        let token: u64 = fields.next()?.parse().ok()?;
        let seq: u64 = fields.next()?.parse().ok()?;
        // accepted, unsure; None: it never reached its commit.
        let decided = match fields.next()? {
            "ok" => Some((true, false)),
            "refused" => Some((false, false)),
            "unsure" => Some((true, true)),
            "failed" => None,
            _ => return None,
        };
        let mut record = self.lock();
        if let Some((accepted, unsure)) = decided {
            record.writes.push(Write {
                t,
                tag,
                token,
                seq,
                accepted,
                fence: Fence::Held,
                unsure,
            });
        }
        let stay = if record.stay.contains(&tag) { " stay" } else { "" };
        drop(record);
        self.shared.changed.notify_all();
        Some(format!("OK{stay}\n"))
    }

    /// A holder that does not write checks in: recorded with the register's
    /// time, answered with ` stay` as a write is.
    fn check_in(&self, rest: &str) -> Option<String> {
        let tag: Tag = rest.trim().parse().ok()?;
        let mut record = self.lock();
        record.checked_in.insert(tag, now_ns());
        let stay = if record.stay.contains(&tag) { " stay" } else { "" };
        drop(record);
        self.shared.changed.notify_all();
        Some(format!("OK{stay}\n"))
    }
}

fn parse_event(rest: &str) -> Option<Event> {
    let mut fields = rest.splitn(4, ' ');
    let tag: Tag = fields.next()?.parse().ok()?;
    let t: u64 = fields.next()?.parse().ok()?;
    let kind = fields.next()?;
    let args = fields.next().unwrap_or("");
    let mut words = args.split(' ');
    let mut token = || -> Option<u64> { words.next()?.parse().ok() };
    let what = match kind {
        "started" => What::Started,
        "session" => What::Session { id: args.to_owned() },
        "session-over" => What::SessionOver { id: args.to_owned() },
        "wait" => What::Waiting,
        "grant" => {
            let (token, key) = args.split_once(' ')?;
            What::Grant {
                token: token.parse().ok()?,
                key: key.to_owned(),
                mode: None,
            }
        }
        "grant-mode" => {
            let (mode, rest) = args.split_once(' ')?;
            let (token, key) = rest.split_once(' ')?;
            What::Grant {
                token: token.parse().ok()?,
                key: key.to_owned(),
                mode: Some(mode.parse().ok()?),
            }
        }
        "converting" | "deadlock" | "convert-timeout" => {
            let (from, to) = args.split_once(' ')?;
            let (from, to) = (from.parse().ok()?, to.parse().ok()?);
            match kind {
                "converting" => What::Converting { from, to },
                "deadlock" => What::Deadlock { from, to },
                _ => What::ConvertTimeout { from, to },
            }
        }
        "convert" => {
            let mut modes = args.split(' ');
            let from = modes.next()?.parse().ok()?;
            let to = modes.next()?.parse().ok()?;
            let token = modes.next()?.parse().ok()?;
            if modes.next().is_some() {
                return None;
            }
            What::Converted { from, to, token }
        }
        "lost" => What::Lost { token: token()? },
        "release" => {
            let value = token()?;
            What::Release {
                token: value,
                dropped: args.ends_with(" drop"),
            }
        }
        "released" => {
            let value = token()?;
            What::Released {
                token: value,
                ok: args.ends_with(" ok"),
            }
        }
        "timeout" => What::Timeout,
        "error" => What::Error {
            message: args.to_owned(),
        },
        "idle" => What::Idle,
        "closed" => What::Closed,
        _ => return None,
    };
    Some(Event { t, tag, what })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse() {
        let event = parse_event("c1.2 77 grant 42 jepsen/register/abc").expect("parses");
        assert_eq!(
            event.tag,
            Tag {
                slot: 1,
                incarnation: 2
            }
        );
        assert_eq!(event.t, 77);
        assert_eq!(
            event.what,
            What::Grant {
                token: 42,
                key: "jepsen/register/abc".into(),
                mode: None,
            }
        );
        let event = parse_event("c0.0 5 release 42 drop").expect("parses");
        assert_eq!(
            event.what,
            What::Release {
                token: 42,
                dropped: true
            }
        );
        assert!(parse_event("c0.0 5 bogus").is_none());
        assert!(parse_event("x 5 idle").is_none());
    }

    #[test]
    fn lock_mode_events_parse() {
        let event = parse_event("c1.0 9 grant-mode PW 42 jepsen/register/dlm/7-x").expect("parses");
        assert_eq!(
            event.what,
            What::Grant {
                token: 42,
                key: "jepsen/register/dlm/7-x".into(),
                mode: Some(LockMode::Pw),
            }
        );
        let parsed = |line: &str| parse_event(line).map(|e| e.what);
        assert_eq!(
            parsed("c1.0 9 converting PR EX"),
            Some(What::Converting {
                from: LockMode::Pr,
                to: LockMode::Ex
            })
        );
        assert_eq!(
            parsed("c1.0 9 convert PR EX 77"),
            Some(What::Converted {
                from: LockMode::Pr,
                to: LockMode::Ex,
                token: 77
            })
        );
        assert_eq!(
            parsed("c1.0 9 deadlock PR PW"),
            Some(What::Deadlock {
                from: LockMode::Pr,
                to: LockMode::Pw
            })
        );
        assert_eq!(
            parsed("c1.0 9 convert-timeout CR EX"),
            Some(What::ConvertTimeout {
                from: LockMode::Cr,
                to: LockMode::Ex
            })
        );
        assert!(parse_event("c1.0 9 grant-mode XX 42 k").is_none());
        assert!(parse_event("c1.0 9 convert PR EX").is_none());
        assert!(parse_event("c1.0 9 convert PR EX 7 8").is_none());
    }

    #[test]
    fn a_check_in_is_recorded_and_answered_with_stay() {
        let history = History { shared: Arc::default() };
        assert_eq!(history.check_in("c2.1").as_deref(), Some("OK\n"));
        let tag = Tag {
            slot: 2,
            incarnation: 1,
        };
        history.lock().stay.push(tag);
        assert_eq!(history.check_in("c2.1").as_deref(), Some("OK stay\n"));
        assert!(history.check_in("nobody").is_none());
        assert!(history.lock().checked_in.contains_key(&tag));
        assert!(history.lock().writes.is_empty(), "a check-in is no write");
    }

    #[test]
    fn the_register_rejects_a_lower_token() {
        let history = History { shared: Arc::default() };
        assert_eq!(history.write("c0.0 5 1").as_deref(), Some("OK\n"));
        assert_eq!(history.write("c1.0 9 1").as_deref(), Some("OK\n"));
        assert_eq!(history.write("c0.0 5 2").as_deref(), Some("REJECT 9\n"));
        assert_eq!(history.write("c1.0 9 2").as_deref(), Some("OK\n"));
        let record = history.lock();
        let accepted: Vec<bool> = record.writes.iter().map(|w| w.accepted).collect();
        assert_eq!(accepted, [true, true, false, true]);
    }

    #[test]
    fn fenced_writes_are_recorded_as_the_backend_decided() {
        let history = History { shared: Arc::default() };
        assert_eq!(history.fenced("c0.0 100 5 1 ok").as_deref(), Some("OK\n"));
        assert_eq!(history.fenced("c0.0 200 5 2 refused").as_deref(), Some("OK\n"));
        assert_eq!(history.fenced("c0.0 300 5 3 unsure").as_deref(), Some("OK\n"));
        assert_eq!(history.fenced("c0.0 400 5 4 failed").as_deref(), Some("OK\n"));
        assert!(history.fenced("c0.0 400 5 4 maybe").is_none());
        let record = history.lock();
        let seen: Vec<(u64, bool, bool)> = record.writes.iter().map(|w| (w.t, w.accepted, w.unsure)).collect();
        assert_eq!(seen, [(100, true, false), (200, false, false), (300, true, true)]);
        assert!(record.writes.iter().all(|w| w.fence == Fence::Held));
    }
}
