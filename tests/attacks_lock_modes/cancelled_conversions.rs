//! One guard's conversions, each cancelled after a random number of polls
//! (every call of its session yields once after it applied) or with the
//! answer of a write lost, beside other sessions taking and dropping NL,
//! CR, CW and PR locks. After each, checked against the server's queue:
//! the guard never claims a mode above the one held; no two incompatible
//! modes are held; a conversion that returned holds the server's token,
//! and an up-conversion (from the mode claimed) to CW, PW or EX a token
//! above every token listed before it; the value block carries the last
//! value a PW or EX holder set, valid.

use super::stress::Rng;
use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_conversions_keep_modes_tokens_and_the_value_block() {
    let mut failures: Vec<String> = Vec::new();
    for seed in 1..=64u64 {
        run(seed, &mut failures).await;
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Polls of a conversion before it is dropped, at most; this many runs it
/// to its end.
const POLLS: usize = 13;

async fn run(seed: u64, failures: &mut Vec<String>) {
    let listening = seed.is_multiple_of(2);
    let mut rng = Rng::new(seed);
    let (gated, s) = gated_sessions(3).await;
    let a = &s[0].1;
    let name = "cancelled-conversions";
    let observer = s[2].1.resource(name).unwrap();
    let mine = a.resource(name).unwrap();
    let mine = if listening { mine.notify_blocking() } else { mine };
    gated.yielding(a);
    let mut guard = lock(&mine, Nl).await;
    let mut others: Vec<ResourceGuard> = Vec::new();
    let mut last_set: Option<Vec<u8>> = None;
    for step in 0..60 {
        if rng.below(4) == 0 {
            if let Some(other) = others.pop() {
                other.release().await.unwrap();
            }
        } else if rng.below(3) == 0 && others.len() < 3 {
            let mode = [Nl, Cr, Cw, Pr][rng.below(4)];
            let who = &s[1 + rng.below(2)].1;
            if let Ok(Some(other)) = bounded("a lock beside", who.resource(name).unwrap().try_lock(mode)).await {
                others.push(other);
            }
        }
        let to = LockMode::ALL[rng.below(6)];
        let claimed = guard.mode();
        let before = listed(&observer).await.iter().filter_map(|c| c.token).max();
        let polls = rng.below(POLLS + 1);
        let lose = rng.below(6) == 0;
        if lose {
            gated.lose_answer(a, "update_queue");
        }
        let outcome = {
            let mut converting = pin!(guard.convert_timeout(to, Duration::from_millis(150)));
            let mut outcome = None;
            for _ in 0..polls {
                if let std::task::Poll::Ready(done) = poll!(&mut converting) {
                    outcome = Some(done);
                    break;
                }
            }
            if polls == POLLS && outcome.is_none() {
                outcome = Some(bounded("a conversion run to its end", converting).await);
            }
            outcome
        };
        if lose {
            gated.ctl.lose.lock().unwrap().clear();
        }
        let queue = listed(&observer).await;
        let what = format!("seed {seed}, step {step}, listening {listening}: {claimed} → {to} after {polls} polls, an answer lost: {lose}, {outcome:?}");
        if let Err(error) = compatible_holders(&queue) {
            failures.push(format!("{what}: {error}"));
        }
        let Some(entry) = queue.iter().find(|c| c.key == guard.key()) else {
            failures.push(format!("{what}: the guard's entry is gone"));
            return;
        };
        let held = entry.granted.expect("a holder's entry");
        if !guard.mode().is_down_from(held) {
            failures.push(format!("{what}: claims {} where {held} is held", guard.mode()));
        }
        let Some(Ok(())) = outcome else {
            continue;
        };
        if guard.mode() != to {
            failures.push(format!("{what}: converted, yet claims {}", guard.mode()));
        }
        if entry.token != Some(guard.token()) {
            failures.push(format!(
                "{what}: token {}, the server's {:?}",
                guard.token(),
                entry.token
            ));
        }
        if to.writes() && !to.is_down_from(claimed) && Some(guard.token()) <= before {
            failures.push(format!(
                "{what}: an up-conversion took {}, not above {before:?}",
                guard.token()
            ));
        }
        if to.sole_writer() {
            let bytes = format!("{seed}-{step}").into_bytes();
            guard.set_value(&bytes).unwrap();
            last_set = Some(bytes);
        } else if let Some(last) = &last_set {
            // Out of PW and EX for sure: the block carries the last value set.
            let look = bounded("an NL look", s[2].1.resource(name).unwrap().try_lock(Nl))
                .await
                .expect("NL")
                .expect("NL is never kept waiting");
            if let Some(wrong) = not_the_last_set(&look.value(), last) {
                failures.push(format!("{what}: {wrong}"));
            }
            look.release().await.unwrap();
        }
    }
    for other in others {
        other.release().await.unwrap();
    }
    guard.release().await.unwrap();
    if let Some(last) = &last_set {
        let next = lock(&observer, Ex).await;
        if let Some(wrong) = not_the_last_set(&next.value(), last) {
            failures.push(format!("seed {seed}, at the end: {wrong}"));
        }
        next.release().await.unwrap();
    }
}

/// What is wrong with a value block that should carry `last`, valid.
fn not_the_last_set(value: &lockline::LockValue, last: &[u8]) -> Option<String> {
    (!value.valid || value.bytes != last).then(|| {
        format!(
            "the block has {:?} (valid: {}), {last:?} was set",
            value.bytes, value.valid
        )
    })
}
