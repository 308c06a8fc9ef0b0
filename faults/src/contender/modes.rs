//! The lock-mode contender (`--modes`): one [`Resource`](lockline::Resource) taken over and over
//! in a random mode, converted up or down now and then while held.
//!
//! Each round it asks for a mode, weighted so that readers and writers
//! conflict (NL 1, CR 3, CW 2, PR 6, PW 5, EX 3 in 20), with `lock()` or,
//! one time in four, `lock_timeout`. It holds for 200–800 ms (longer while
//! the register's answers say `stay`). Half of the grants convert once or
//! twice while held, to another mode weighted likewise (NL 1, CR 2, CW 1,
//! PR 3, PW 3, EX 3): a down-conversion is reported as asked for (the holder
//! stops using the stronger mode then), an up-conversion (with `convert`,
//! or half the time `convert_timeout`) once granted; `Error::Deadlock` (two
//! holders converting past each other) and a timeout are expected outcomes,
//! reported, and the holder keeps its mode. A holder asked to stay does not
//! convert: the nemesis wants it as it is when the fault bites.
//!
//! While held in PW or EX it writes the fenced register every 50 ms: a key
//! of the lock's own store per write ([`register_key`]), with
//! `ResourceGuard::write_if_held` and its current token, the harness told
//! what it answered (`F`). In NL, CR, CW and PR it does not write (a fence
//! of "the highest token wins" cannot serve concurrent CW writers): it
//! checks in (`S`) every 50 ms instead, so that the nemesis can still ask it
//! to stay. It stops when the guard's `lost()` resolves (a careless holder
//! after one more write or check-in), then releases or drops the guard as
//! the mutex contender does.

use std::time::Duration;

use lockline::{Error, LockMode, ResourceGuard, Write};

use super::{Register, Verdict, Worker, HANG_SLACK};
use crate::clock::now_ns;
use crate::rng::Rng;
use crate::Backend;

/// The modes asked for, with their weights: PR, PW and EX most, so that
/// protected readers and writers conflict; NL least (it waits for nobody).
const REQUEST_WEIGHTS: [(LockMode, usize); 6] = [
    (LockMode::Nl, 1),
    (LockMode::Cr, 3),
    (LockMode::Cw, 2),
    (LockMode::Pr, 6),
    (LockMode::Pw, 5),
    (LockMode::Ex, 3),
];

/// The modes converted to (the mode held left out), with their weights.
const CONVERSION_WEIGHTS: [(LockMode, usize); 6] = [
    (LockMode::Nl, 1),
    (LockMode::Cr, 2),
    (LockMode::Cw, 1),
    (LockMode::Pr, 3),
    (LockMode::Pw, 3),
    (LockMode::Ex, 3),
];

/// The prefix of the fenced register's keys in the lock's own store.
pub const REGISTER_PREFIX: &str = "faults-register/";

/// The key one write of the fenced register puts: `faults-register/w-<tag>-<token>-<seq>`
/// (an absolute path on ZooKeeper). Beside the lock, never under it, and
/// not shaped like an entry of any layout (the last segment is not hex).
pub fn register_key(backend: Backend, tag: &str, token: u64, seq: u64) -> String {
    let key = format!("{REGISTER_PREFIX}w-{tag}-{token}-{seq}");
    if backend == Backend::ZooKeeper {
        format!("/{key}")
    } else {
        key
    }
}

/// Reads back what [`register_key`] wrote: the tag, the token and the seq.
pub fn parse_register_key(key: &str) -> Option<(String, u64, u64)> {
    let rest = key
        .trim_start_matches('/')
        .strip_prefix(REGISTER_PREFIX)?
        .strip_prefix("w-")?;
    let (rest, seq) = rest.rsplit_once('-')?;
    let (tag, token) = rest.rsplit_once('-')?;
    Some((tag.to_owned(), token.parse().ok()?, seq.parse().ok()?))
}

fn weighted(rng: &mut Rng, weights: &[(LockMode, usize)], except: Option<LockMode>) -> LockMode {
    let choices: Vec<(LockMode, usize)> = weights.iter().copied().filter(|&(m, _)| Some(m) != except).collect();
    let total: usize = choices.iter().map(|&(_, w)| w).sum();
    let mut pick = rng.below(total);
    for (mode, weight) in &choices {
        if pick < *weight {
            return *mode;
        }
        pick -= weight;
    }
    LockMode::Ex
}

/// How a conversion ended for the holder.
enum Conversion {
    /// It holds on (converted, or kept its mode after a deadlock or a timeout).
    Holding,
    /// The lock was lost, learnt at this time.
    Lost(u64),
    /// It went wrong otherwise, or the contender is stopping: let go.
    Done,
}

fn is_loss(error: &Error) -> bool {
    matches!(
        error,
        Error::SessionLost { .. } | Error::LockLost { .. } | Error::Closed { .. }
    )
}

impl Worker {
    /// Takes the resource in random modes until told to stop.
    pub(super) async fn contend_modes(&mut self, rng: &mut Rng, register: &mut Register) {
        while !self.stopping() {
            let Some(session) = self.session().await else { return };
            let resource = match session.resource(&self.name) {
                Ok(resource) => resource,
                Err(error) => {
                    self.reporter.now(&format!("error resource: {error}"));
                    continue;
                }
            };
            let mode = weighted(rng, &REQUEST_WEIGHTS, None);
            let timeout = rng.chance(0.25).then(|| rng.millis(300, 2000));
            self.reporter
                .now(if timeout.is_some() { "wait timeout" } else { "wait lock" });
            let mut stop = self.stop.clone();
            let acquired = tokio::select! {
                result = async {
                    match timeout {
                        Some(timeout) => {
                            let bound = timeout + self.options.request_timeout() + HANG_SLACK;
                            match tokio::time::timeout(bound, resource.lock_timeout(mode, timeout)).await {
                                Ok(result) => result,
                                Err(_) => {
                                    self.reporter.now(&format!(
                                        "error hang: lock_timeout({mode}, {timeout:?}) did not return within {bound:?}"
                                    ));
                                    Err(Error::Timeout { name: self.name.clone(), waited: bound, held_by_this_session: false })
                                }
                            }
                        }
                        None => resource.lock(mode).await,
                    }
                } => result,
                // Cancelling the acquire: lockline removes its entry.
                _ = stop.wait_for(|s| *s) => return,
            };
            match acquired {
                Ok(guard) => {
                    let granted = now_ns();
                    self.reporter.at(
                        granted,
                        &format!("grant-mode {mode} {} {}", guard.token().get(), guard.key()),
                    );
                    self.hold_in_mode(guard, rng, register).await;
                }
                Err(Error::Timeout { .. }) => self.reporter.now("timeout"),
                Err(error) => {
                    self.reporter.now(&format!("error lock: {error}"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            tokio::time::sleep(rng.millis(0, 150)).await;
        }
    }

    async fn hold_in_mode(&mut self, mut guard: ResourceGuard, rng: &mut Rng, register: &mut Register) {
        let mut until = tokio::time::Instant::now() + rng.millis(200, 800);
        let drop_it = rng.chance(0.2);
        let careless = rng.chance(0.5);
        let mut conversions = if rng.chance(0.5) { 1 + rng.below(2) } else { 0 };
        let mut lost_at = None;
        let mut seq = 0u64;
        'holding: loop {
            let (mode, token) = (guard.mode(), guard.token().get());
            let answered = {
                let lost = guard.lost();
                tokio::pin!(lost);
                let step = async {
                    if !mode.sole_writer() {
                        return register.check_in().await;
                    }
                    let (verdict, asked, error) = self.write_in_mode(&guard, token, seq).await;
                    if let Some(error) = error {
                        self.reporter.now(&format!("error {error}"));
                    }
                    register.fenced(asked, token, seq, verdict).await
                };
                tokio::pin!(step);
                loop {
                    tokio::select! {
                        biased;
                        _ = &mut lost, if lost_at.is_none() => lost_at = Some(now_ns()),
                        answered = &mut step => break answered,
                    }
                }
            };
            if mode.sole_writer() {
                seq += 1;
            }
            let stay = match answered {
                Ok(stay) => stay,
                Err(_) => {
                    self.reporter.now("error register connection");
                    false
                }
            };
            if stay {
                until = until.max(tokio::time::Instant::now() + Duration::from_millis(200));
            }
            if lost_at.is_some() || self.stopping() || tokio::time::Instant::now() >= until {
                break 'holding;
            }
            if conversions > 0 && !stay && rng.chance(0.3) {
                conversions -= 1;
                match self.convert(&mut guard, rng).await {
                    Conversion::Holding => continue 'holding,
                    Conversion::Lost(t) => {
                        lost_at = Some(t);
                        break 'holding;
                    }
                    Conversion::Done => break 'holding,
                }
            }
            let lost = guard.lost();
            let mut stop = self.stop.clone();
            tokio::select! {
                biased;
                _ = lost, if lost_at.is_none() => {
                    lost_at = Some(now_ns());
                    if !careless {
                        break 'holding;
                    }
                }
                _ = stop.wait_for(|s| *s) => break 'holding,
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
        let token = guard.token().get();
        if let Some(t) = lost_at {
            self.reporter.at(t, &format!("lost {token}"));
            // Fenced: it cannot remove a newer holder's entry.
            drop(guard);
            return;
        }
        if drop_it {
            self.reporter.now(&format!("release {token} drop"));
            drop(guard);
            return;
        }
        self.reporter.now(&format!("release {token} release"));
        let bound = self.options.request_timeout() * 2 + HANG_SLACK;
        let Ok(result) = tokio::time::timeout(bound, guard.release()).await else {
            self.reporter
                .now(&format!("error hang: release() did not return within {bound:?}"));
            return;
        };
        let outcome = if result.is_ok() { "ok" } else { "error" };
        self.reporter.now(&format!("released {token} {outcome}"));
        if let Err(error) = result {
            self.reporter.now(&format!("error release: {error}"));
        }
    }

    /// One write of the fenced register while holding in PW or EX: the
    /// verdict, the time just before it was asked for, and what went wrong.
    async fn write_in_mode(&self, guard: &ResourceGuard, token: u64, seq: u64) -> (Verdict, u64, Option<String>) {
        let key = register_key(self.backend, &self.reporter.tag, token, seq);
        let bound = self.options.request_timeout() + HANG_SLACK;
        let asked = now_ns();
        let write = guard.write_if_held([Write::put(key.clone(), token.to_string())]);
        match tokio::time::timeout(bound, write).await {
            Ok(Ok(())) => (Verdict::Committed, asked, None),
            Ok(Err(error)) if is_loss(&error) => (Verdict::Refused, asked, None),
            // The writes may have been applied: read back at the end.
            Ok(Err(error @ Error::Unavailable { .. })) => {
                (Verdict::Unsure, asked, Some(format!("write_if_held {key}: {error}")))
            }
            // Nothing was written.
            Ok(Err(error)) => (Verdict::Failed, asked, Some(format!("write_if_held {key}: {error}"))),
            Err(_) => (
                Verdict::Unsure,
                asked,
                Some(format!("hang: write_if_held {key} did not return within {bound:?}")),
            ),
        }
    }

    /// Converts the guard to another mode, and reports it.
    async fn convert(&mut self, guard: &mut ResourceGuard, rng: &mut Rng) -> Conversion {
        let from = guard.mode();
        let to = weighted(rng, &CONVERSION_WEIGHTS, Some(from));
        if to.is_down_from(from) {
            // From now on the holder uses `to` only; the server may grant
            // others what `to` admits as soon as the conversion lands.
            self.reporter
                .now(&format!("convert {from} {to} {}", guard.token().get()));
            let bound = self.options.request_timeout() * 2 + HANG_SLACK;
            return match tokio::time::timeout(bound, guard.convert(to)).await {
                Ok(Ok(())) => Conversion::Holding,
                Ok(Err(error)) if is_loss(&error) => Conversion::Lost(now_ns()),
                Ok(Err(error)) => {
                    self.reporter.now(&format!("error convert {from} to {to}: {error}"));
                    Conversion::Done
                }
                Err(_) => {
                    self.reporter.now(&format!(
                        "error hang: convert({to}) from {from} did not return within {bound:?}"
                    ));
                    Conversion::Done
                }
            };
        }
        self.reporter.now(&format!("converting {from} {to}"));
        let patience = rng.chance(0.5).then(|| rng.millis(300, 2000));
        let mut stop = self.stop.clone();
        let converted = tokio::select! {
            converted = async {
                match patience {
                    Some(timeout) => {
                        let bound = timeout + self.options.request_timeout() + HANG_SLACK;
                        match tokio::time::timeout(bound, guard.convert_timeout(to, timeout)).await {
                            Ok(result) => result,
                            Err(_) => {
                                self.reporter.now(&format!(
                                    "error hang: convert_timeout({to}, {timeout:?}) from {from} did not return within {bound:?}"
                                ));
                                Err(Error::Timeout { name: self.name.clone(), waited: bound, held_by_this_session: false })
                            }
                        }
                    }
                    None => guard.convert(to).await,
                }
            } => converted,
            // Cancelling gives the conversion up: the lock keeps `from`.
            _ = stop.wait_for(|s| *s) => return Conversion::Done,
        };
        match converted {
            Ok(()) => {
                self.reporter
                    .now(&format!("convert {from} {to} {}", guard.token().get()));
                Conversion::Holding
            }
            Err(Error::Deadlock { .. }) => {
                self.reporter.now(&format!("deadlock {from} {to}"));
                Conversion::Holding
            }
            Err(Error::Timeout { .. }) => {
                self.reporter.now(&format!("convert-timeout {from} {to}"));
                Conversion::Holding
            }
            Err(error) if is_loss(&error) => Conversion::Lost(now_ns()),
            Err(error) => {
                self.reporter.now(&format!("error convert {from} to {to}: {error}"));
                Conversion::Done
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_keys_read_back() {
        let key = register_key(Backend::Etcd, "c3.1", 1234, 7);
        assert_eq!(key, "faults-register/w-c3.1-1234-7");
        assert_eq!(parse_register_key(&key), Some(("c3.1".to_owned(), 1234, 7)));
        let path = register_key(Backend::ZooKeeper, "c0.0", 5, 0);
        assert_eq!(path, "/faults-register/w-c0.0-5-0");
        assert_eq!(parse_register_key(&path), Some(("c0.0".to_owned(), 5, 0)));
        assert_eq!(parse_register_key("faults-register/other"), None);
        assert_eq!(parse_register_key("jepsen/register/w-c0.0-5-0"), None);
    }

    #[test]
    fn modes_are_drawn_by_weight_and_a_conversion_changes_the_mode() {
        let mut rng = Rng::new(3, 9);
        let mut counts = [0usize; 6];
        for _ in 0..20_000 {
            counts[weighted(&mut rng, &REQUEST_WEIGHTS, None) as usize] += 1;
        }
        // PR is drawn about six times as often as NL, and every mode is drawn.
        assert!(counts.iter().all(|&n| n > 0), "{counts:?}");
        assert!(
            counts[LockMode::Pr as usize] > 4 * counts[LockMode::Nl as usize],
            "{counts:?}"
        );
        for from in LockMode::ALL {
            for _ in 0..100 {
                assert_ne!(weighted(&mut rng, &CONVERSION_WEIGHTS, Some(from)), from);
            }
        }
    }
}
