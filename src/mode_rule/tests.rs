//! Tests of the lock-mode rule: the states and the value block as stored,
//! who blocks whom, and cycles.

use super::*;
use crate::backend::WAITING_EX;
use crate::FencingToken;
use LockMode::*;

fn view(states: &[State]) -> View {
    View {
        slots: states
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let entry = Entry {
                    key: format!("r/{i}"),
                    kind: EntryKind::Dlm,
                    order: i as i64,
                    token: FencingToken::new(i as u64),
                    owner: None,
                };
                let slot = Slot {
                    entry,
                    value: s.encode(),
                    version: 1,
                    changed: i as u64,
                };
                (slot, *s)
            })
            .collect(),
        block: Block::fresh(),
    }
}

fn converting(from: LockMode, to: LockMode) -> State {
    State {
        granted: Some(from),
        requested: to,
        token: 1,
        blocked: 0,
        since: 0,
        conv: 0,
    }
}

#[test]
fn states_round_trip() {
    let marked = State {
        since: 5,
        conv: 7,
        ..converting(Pr, Ex)
    };
    for state in [State::waiting(Pw), State::held(Cr, 17), marked] {
        assert_eq!(State::decode(&state.encode(), 99), state);
    }
    assert_eq!(
        State::decode(&converting(Pr, Ex).encode(), 99).since,
        99,
        "a mark's own write order"
    );
    assert_eq!(State::decode(&State::held(Ex, 0).encode(), 42).token, 42);
    assert_eq!(State::decode(b"rubbish", 1), State::waiting(Ex));
    assert_ne!(
        State::held(Ex, 3).encode(),
        State::held(Ex, 3).encode(),
        "a nonce per write"
    );
}

#[test]
fn states_are_written_in_the_documented_layout() {
    let state = State {
        granted: Some(Pr),
        requested: Ex,
        token: u64::MAX,
        blocked: WAITS | LISTENING | Cw.bit(),
        since: 10,
        conv: u32::MAX,
    };
    for (state, head) in [
        (state, format!("dlm2 PR EX {} 196 10 {} ", u64::MAX, u32::MAX)),
        (State::waiting(Nl), "dlm2 - NL 0 0 0 0 ".to_owned()),
    ] {
        let written = String::from_utf8(state.encode()).expect("text");
        let (before, nonce) = written.split_at(written.len() - 8);
        assert_eq!(before, head);
        assert!(
            nonce.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
            "{nonce}"
        );
    }
    let nonces: std::collections::HashSet<u32> = (0..1000).map(|_| state::rand_nonce()).collect();
    assert_eq!(nonces.len(), 1000, "a thread's nonces do not repeat soon");
    let other = std::thread::spawn(state::rand_nonce).join().expect("thread");
    assert!(!nonces.contains(&other), "another thread draws from its own seed");
}

#[test]
fn blocks_are_written_in_the_documented_layout() {
    let named = Block {
        value: LockValue {
            bytes: b"v\n1".to_vec(),
            sequence: u64::MAX,
            valid: false,
        },
        holder: Some(("r/dlm/é".to_owned(), -3)),
    };
    let mut expected = format!("lvb1 {} 0 -3 8\nr/dlm/é", u64::MAX).into_bytes();
    expected.extend_from_slice(b"v\n1");
    assert_eq!(named.encode(), expected);
    assert_eq!(Block::fresh().encode(), b"lvb1 0 1 0 0\n".to_vec());
}

#[test]
fn blocks_round_trip() {
    let block = Block {
        value: LockValue {
            bytes: b"a\nb c".to_vec(),
            sequence: 4,
            valid: true,
        },
        holder: Some(("x/dlm/1 2".to_owned(), 9)),
    };
    assert_eq!(Block::decode(Some(&block.encode())), block);
    assert_eq!(Block::decode(None), Block::fresh());
    assert!(!Block::decode(Some(b"junk")).value.valid);
}

#[test]
fn a_request_waits_on_the_nearest_earlier_blocker() {
    let v = view(&[State::held(Pw, 1), State::held(Cr, 2), State::waiting(Pr)]);
    assert_eq!(v.blocker(2), Some(0));
    let v = view(&[State::held(Pr, 1), State::waiting(Ex), State::waiting(Cr)]);
    assert_eq!(v.blocker(2), Some(1), "CR waits behind a waiting EX: no bypass");
}

#[test]
fn a_converting_entry_blocks_with_both_modes() {
    let v = view(&[converting(Cw, Pr), State::waiting(Pr)]);
    assert_eq!(v.blocker(1), Some(0));
    let v = view(&[converting(Cw, Pr), State::waiting(Cw)]);
    assert_eq!(v.blocker(1), Some(0));
}

#[test]
fn an_up_conversion_waits_for_granted_entries_and_earlier_requests_only() {
    let v = view(&[converting(Pr, Ex), State::held(Pr, 2), State::waiting(Pr)]);
    assert_eq!(v.blockers(0), vec![1]);
    let v = view(&[State::waiting(Ex), converting(Cr, Pw)]);
    assert_eq!(v.blockers(1), vec![0], "an earlier waiting request it conflicts with");
}

#[test]
fn two_readers_converting_up_deadlock() {
    let v = view(&[converting(Pr, Ex), converting(Pr, Ex)]);
    assert!(v.in_cycle(1));
    let v = view(&[converting(Pr, Ex), State::held(Pr, 2)]);
    assert!(!v.in_cycle(0));
}

#[test]
fn the_conversion_whose_mark_closed_a_cycle_gives_up() {
    let marked = |since| State {
        since,
        ..converting(Pr, Ex)
    };
    let v = view(&[marked(1), marked(2)]);
    assert!(v.closes_cycle(1) && !v.closes_cycle(0));
    // Three: the last closes a cycle, and so does the second (with the
    // first alone): each gives up rather than wait on the other.
    let v = view(&[marked(1), marked(2), marked(3)]);
    assert!(v.closes_cycle(2) && v.closes_cycle(1) && !v.closes_cycle(0));
}

#[test]
fn a_cycle_through_a_waiting_request_is_found() {
    // PR→EX, a PW request behind it, a CR holder converting to PR.
    let v = view(&[converting(Pr, Ex), State::waiting(Pw), converting(Cr, Pr)]);
    // entry 2 (CR→PR) waits for the earlier PW request; the PW request
    // waits for entry 0; entry 0 (→EX) waits for granted entry 2.
    assert!(v.in_cycle(2));
}

/// The window an EX append reads back (the entries nearest before the new
/// request): the nearest blocker it finds there is the one the whole queue
/// gives, and a window that reaches the head decides as the whole queue.
#[test]
fn a_window_before_a_request_finds_the_whole_queues_blocker() {
    const MODES: [LockMode; 6] = [Nl, Cr, Cw, Pr, Pw, Ex];
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let mut waited = 0;
    for _ in 0..20_000 {
        let len = 1 + next(9);
        let mut states: Vec<State> = (0..len - 1)
            .map(|_| {
                let requested = MODES[next(6)];
                match next(3) {
                    0 => State::waiting(requested),
                    1 => State::held(requested, 1),
                    _ => State {
                        requested,
                        ..State::held(MODES[next(6)], 1)
                    },
                }
            })
            .collect();
        states.push(State::waiting(MODES[next(6)]));
        let at = len - 1;
        let whole = view(&states).blocker(at);
        for count in 1..=4 {
            let from = at.saturating_sub(count);
            let window = view(&states[from..]);
            match window.blocker(at - from) {
                Some(on) => {
                    waited += 1;
                    assert_eq!(Some(on + from), whole, "{states:?} window of {count}");
                }
                None if from == 0 => assert_eq!(whole, None, "{states:?}"),
                None => {}
            }
        }
    }
    assert!(waited > 10_000, "the windows found blockers {waited} times");
}

/// The queues the rule can reach, built step by step: requests appended
/// (granted at once when nothing earlier blocks them), entries leaving
/// (the waiters their departure lets in granted, as a hand-over does),
/// and holders converting (granted at once when nothing blocks the new
/// mode, else left converting). In each, the prefix a woken waiter may
/// read (through the first request that waits for EX and was never
/// granted, its value beginning with `WAITING_EX`) decides as the whole
/// queue: every waiting request in it finds the same blocker; a holder's
/// departure lets in the same entries in it, and beyond it NL requests
/// only; the value block's holder is found alive or lost alike.
#[test]
fn a_prefix_through_the_first_waiting_ex_request_decides_as_the_whole_queue() {
    const MODES: [LockMode; 6] = [Nl, Cr, Cw, Pr, Pw, Ex];
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let waits = |state: State| State {
        blocked: WAITS,
        ..state
    };
    let mut cut = 0;
    for _ in 0..4_000 {
        let mut states: Vec<State> = Vec::new();
        for _ in 0..12 {
            match next(4) {
                // A departure, and the hand-over it makes.
                0 if !states.is_empty() => {
                    let at = next(states.len());
                    let grants = view(&states).handed_over(at);
                    for &(i, mode) in &grants {
                        states[i] = State::held(mode, 1);
                    }
                    states.remove(at);
                }
                // A conversion of a settled holder.
                1 if states.iter().any(|s| s.granted.is_some() && s.converting().is_none()) => {
                    let settled: Vec<usize> = (0..states.len())
                        .filter(|&i| states[i].granted.is_some() && states[i].converting().is_none())
                        .collect();
                    let at = settled[next(settled.len())];
                    states[at].requested = MODES[next(6)];
                    if view(&states).blockers(at).is_empty() {
                        states[at] = State::held(states[at].requested, 1);
                    }
                }
                _ => {
                    states.push(waits(State::waiting(MODES[next(6)])));
                    let at = states.len() - 1;
                    if view(&states).blocker(at).is_none() {
                        states[at] = State::held(states[at].requested, 1);
                    }
                }
            }
        }
        let whole = view(&states);
        let Some(end) = whole
            .slots
            .iter()
            .position(|(slot, _)| slot.value.starts_with(WAITING_EX))
        else {
            continue;
        };
        if end + 1 == states.len() {
            continue;
        }
        cut += 1;
        // What makes the prefix enough: behind a request that waits for
        // EX, nothing holds a mode but NL.
        for state in &states[end + 1..] {
            assert!(matches!(state.granted, None | Some(Nl)), "{states:?}");
        }
        let mut prefix = view(&states[..=end]);
        for at in 0..=end {
            if states[at].granted.is_none() {
                assert_eq!(prefix.blocker(at), whole.blocker(at), "{states:?} at {at}");
                // A request leaves deciding from a whole read; a holder
                // may hand over from the prefix its grant read.
                continue;
            }
            let from_whole = whole.handed_over(at);
            let in_prefix: Vec<(usize, LockMode)> = from_whole.iter().copied().filter(|&(i, _)| i <= end).collect();
            assert_eq!(prefix.handed_over(at), in_prefix, "{states:?} leaving {at}");
            assert!(from_whole.iter().all(|&(i, mode)| i <= end || mode == Nl), "{states:?}");
        }
        // A block naming each PW or EX holder, or an entry gone.
        let mut named: Vec<(String, i64)> = (0..states.len())
            .filter(|&i| states[i].granted.is_some_and(LockMode::sole_writer))
            .map(|i| (whole.slots[i].0.entry.key.clone(), whole.slots[i].0.entry.order))
            .collect();
        named.push(("r/gone".to_owned(), -1));
        for holder in named {
            let block = Block {
                holder: Some(holder),
                ..Block::fresh()
            };
            prefix.block = block.clone();
            let whole = View { block, ..view(&states) };
            assert_eq!(
                prefix.block.lost_holder(&prefix),
                whole.block.lost_holder(&whole),
                "{states:?}"
            );
            assert_eq!(prefix.block.seen(&prefix), whole.block.seen(&whole), "{states:?}");
        }
    }
    assert!(cut > 500, "a prefix shorter than the queue {cut} times");
}

/// Every state of a request that waits for EX and was never granted is
/// written beginning with `WAITING_EX`, whatever its marks; no other state
/// is.
#[test]
fn only_a_waiting_ex_request_is_written_beginning_with_waiting_ex() {
    const MODES: [LockMode; 6] = [Nl, Cr, Cw, Pr, Pw, Ex];
    for requested in MODES {
        for blocked in [0, WAITS, LISTENING | WAITS | Ex.bit(), u8::MAX] {
            let waiting = State {
                blocked,
                ..State::waiting(requested)
            };
            assert_eq!(waiting.encode().starts_with(WAITING_EX), requested == Ex, "{waiting:?}");
            for granted in MODES {
                let held = State {
                    blocked,
                    ..converting(granted, requested)
                };
                assert!(!held.encode().starts_with(WAITING_EX), "{held:?}");
            }
        }
    }
}

/// `backend::only_owner_unblocks` is sound: for every state it accepts,
/// no write another session can make (its grant in the mode it asked for,
/// a waiter's marks, kept or cleared) changes whom the entry blocks, for
/// any waiter (a request in any mode, a holder converting between any two).
/// It refuses conversions under way, whose grant (by its owner, today)
/// does change whom they block (CW converting to PR, and a PR request
/// behind it), and values lockline did not write.
#[test]
fn only_the_owner_unblocks_a_waiting_request_or_a_lock_held_in_its_mode() {
    use crate::backend::only_owner_unblocks;
    const MODES: [LockMode; 6] = [Nl, Cr, Cw, Pr, Pw, Ex];
    let marks = [
        0,
        WAITS,
        LISTENING,
        WAITS | Pr.bit(),
        LISTENING | Ex.bit() | Cw.bit(),
        0x3f,
    ];
    let mut waiters: Vec<State> = MODES.into_iter().map(State::waiting).collect();
    for from in MODES {
        for to in MODES.into_iter().filter(|&to| to != from) {
            waiters.push(converting(from, to));
        }
    }
    let mut accepted = 0;
    for granted in std::iter::once(None).chain(MODES.into_iter().map(Some)) {
        for requested in MODES {
            for blocked in marks {
                let entry = State {
                    granted,
                    requested,
                    token: 3,
                    blocked,
                    since: 5,
                    conv: 2,
                };
                if !only_owner_unblocks(&entry.encode()) {
                    continue;
                }
                accepted += 1;
                let writes = marks.into_iter().flat_map(|blocked| {
                    [
                        State {
                            granted: Some(requested),
                            token: 9,
                            blocked,
                            ..entry
                        },
                        State { blocked, ..entry },
                    ]
                });
                for written in writes {
                    for &me in &waiters {
                        assert_eq!(
                            blocks(written, me),
                            blocks(entry, me),
                            "{entry:?} written as {written:?} by another session, for {me:?}"
                        );
                    }
                }
            }
        }
    }
    // Every request waiting, every lock held in its mode, with every mark.
    assert_eq!(accepted, (6 + 6) * marks.len());
    let conversion = converting(Cw, Pr);
    let granted = State::held(Pr, 9);
    let behind = State::waiting(Pr);
    assert!(!only_owner_unblocks(&conversion.encode()));
    assert!(
        blocks(conversion, behind) && !blocks(granted, behind),
        "the grant lets the PR request on"
    );
    assert!(!only_owner_unblocks(b"not lockline's"));
    assert!(!only_owner_unblocks(b""));
    let mut waiting_ex = State::waiting(Ex).encode();
    assert!(waiting_ex.starts_with(WAITING_EX) && only_owner_unblocks(&waiting_ex));
    waiting_ex.truncate(WAITING_EX.len());
    assert!(!only_owner_unblocks(&waiting_ex), "a value cut short is not lockline's");
}

/// The state reader as it was written first, over `str::split` and
/// `str::parse`: what the hand-written one must take, and refuse, alike.
fn parse_with_str(value: &[u8], changed: u64) -> Option<State> {
    let text = std::str::from_utf8(value).ok()?;
    let mut words = text.split(' ');
    if words.next()? != state::STATE_HEAD {
        return None;
    }
    let granted = match words.next()? {
        "-" => None,
        mode => Some(mode.parse().ok()?),
    };
    let requested = words.next()?.parse().ok()?;
    let token = match words.next()?.parse().ok()? {
        0 if granted.is_some() => changed,
        token => token,
    };
    let blocked = words.next()?.parse().ok()?;
    let converting = granted.is_some_and(|g| g != requested);
    let since = match words.next()?.parse().ok()? {
        0 if converting => changed,
        since => since,
    };
    let conv = words.next()?.parse().ok()?;
    Some(State {
        granted,
        requested,
        token,
        blocked,
        since,
        conv,
    })
}

#[test]
fn parse_state_reads_what_str_parse_read() {
    let mut values: Vec<Vec<u8>> = Vec::new();
    for granted in ["-", "EX", "pr", "Cw", "XX", ""] {
        for requested in ["NL", "ex", "PW", "P", ""] {
            for token in [
                "0",
                "7",
                "+7",
                "+",
                "18446744073709551615",
                "18446744073709551616",
                "-1",
                "1a",
                "",
            ] {
                for blocked in ["0", "255", "256", "+3", "x"] {
                    for tail in [
                        "0 0 0a1b2c3d",
                        "5 4294967295 ffffffff",
                        "5 4294967296 0",
                        "0",
                        "0 0",
                        "0 0 x y z",
                        "",
                    ] {
                        values.push(format!("dlm2 {granted} {requested} {token} {blocked} {tail}").into_bytes());
                    }
                }
            }
        }
    }
    values.push(b"dlm2".to_vec());
    values.push(b"".to_vec());
    values.push(b"dlm1 EX EX 1 0 0 0 00000000".to_vec());
    values.push(b"dlm2  EX 1 0 0 0 00000000".to_vec());
    values.push(b"dlm2 EX EX 1 0 0 0 \xff\xfe".to_vec());
    values.push(b"dlm2 EX EX 1 0 0 0".to_vec());
    values.push(State::held(Pw, 42).encode());
    values.push(State::waiting(Cr).encode());
    for value in &values {
        for changed in [0, 99] {
            assert_eq!(
                State::parse(value, changed),
                parse_with_str(value, changed),
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
    }
    assert!(values.iter().filter(|v| State::parse(v, 1).is_some()).count() > 100);
}

/// The block reader as it was written first, over `str::split` and
/// `str::parse`.
fn parse_block_with_str(stored: &[u8]) -> Option<Block> {
    let line_end = stored.iter().position(|&b| b == b'\n')?;
    let head = std::str::from_utf8(&stored[..line_end]).ok()?;
    let mut words = head.split(' ');
    if words.next()? != "lvb1" {
        return None;
    }
    let sequence = words.next()?.parse().ok()?;
    let valid = words.next()? == "1";
    let order: i64 = words.next()?.parse().ok()?;
    let key_len: usize = words.next()?.parse().ok()?;
    let rest = &stored[line_end + 1..];
    if rest.len() < key_len {
        return None;
    }
    let key = std::str::from_utf8(&rest[..key_len]).ok()?;
    Some(Block {
        value: LockValue {
            bytes: rest[key_len..].to_vec(),
            sequence,
            valid,
        },
        holder: (!key.is_empty()).then(|| (key.to_owned(), order)),
    })
}

#[test]
fn parse_block_reads_what_str_parse_read() {
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    for sequence in [
        "0",
        "17",
        "+17",
        "-1",
        "18446744073709551615",
        "18446744073709551616",
        "",
    ] {
        for valid in ["1", "0", "x"] {
            for order in [
                "0",
                "-5",
                "+5",
                "-",
                "+",
                "--5",
                "-+5",
                "9223372036854775807",
                "9223372036854775808",
                "-9223372036854775808",
                "-9223372036854775809",
            ] {
                for (len, rest) in [("0", ""), ("3", "r/1value"), ("9", "r/1"), ("+2", "ab"), ("x", "")] {
                    blocks.push(format!("lvb1 {sequence} {valid} {order} {len}\n{rest}").into_bytes());
                }
            }
        }
    }
    blocks.push(b"lvb1 1 1 0 0".to_vec());
    blocks.push(b"lvb2 1 1 0 0\n".to_vec());
    blocks.push(b"lvb1 1 1 0 0 extra\nvalue".to_vec());
    blocks.push(b"lvb1 1 1 0 2\n\xff\xfevalue".to_vec());
    blocks.push(b"lvb1 \xff 1 0 0\n".to_vec());
    for stored in &blocks {
        assert_eq!(
            Block::parse(stored),
            parse_block_with_str(stored),
            "{:?}",
            String::from_utf8_lossy(stored)
        );
    }
    assert!(blocks.iter().filter(|b| Block::parse(b).is_some()).count() > 50);
}

/// A `try_` request's entry and a `try_convert`'s mark say that they never
/// wait, through a write and a read; a request that waits, a conversion
/// that waits and a settled holder do not.
#[test]
fn tries_say_they_never_wait() {
    let round_trip = |state: State| State::parse(&state.encode(), 7).expect("parses");
    let try_request = State {
        conv: TRY_REQUEST,
        ..State::waiting(Pw)
    };
    assert!(round_trip(try_request).never_waits());
    assert!(!round_trip(State::waiting(Pw)).never_waits());
    for _ in 0..100 {
        let (waits, tries) = (State::conversion_id(true), State::conversion_id(false));
        assert!(waits % 2 == 1 && tries % 2 == 0 && tries != 0);
        let mark = |conv| State {
            conv,
            ..converting(Pr, Ex)
        };
        assert!(!round_trip(mark(waits)).never_waits());
        assert!(round_trip(mark(tries)).never_waits());
        // Settled with an old conversion's id left: it holds, and waits for nothing.
        assert!(!round_trip(State {
            conv: tries,
            ..State::held(Ex, 3)
        })
        .never_waits());
    }
}
