//! Reading the replies of the lock scripts: entries, queue slots, values.

use super::*;

/// An error of a step on lock `name`: a key of another type is named by
/// the lock, not by the step.
pub(super) fn for_lock(error: Error, name: &str) -> Error {
    match error {
        Error::InvalidName { reason, .. } => Error::InvalidName {
            name: name.to_owned(),
            reason,
        },
        other => other,
    }
}

/// What a script's reply item says of one entry.
pub(super) fn entry_from(name: &str, item: &Value) -> Option<Entry> {
    let Value::Array(fields) = item else { return None };
    let [member, kind, order, owner] = fields.as_slice() else {
        return None;
    };
    let kind = text(kind)?;
    if kind == "plain" {
        return Some(layout::plain_blocker(name));
    }
    let member = text(member)?;
    let order: i64 = text(order)?.parse().ok()?;
    Some(Entry {
        key: layout::entry_key(name, &member),
        kind: layout::kind_from_label(&kind),
        order,
        token: FencingToken::new(order.unsigned_abs()),
        owner: Some(text(owner)?),
    })
}

pub(super) fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

pub(super) fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        Value::BulkString(_) | Value::SimpleString(_) => text(value)?.parse().ok(),
        _ => None,
    }
}

pub(super) fn entries_from(name: &str, value: &Value) -> Option<Vec<Entry>> {
    let Value::Array(items) = value else { return None };
    items.iter().map(|item| entry_from(name, item)).collect()
}

/// The bytes of a value in a script's reply (nil: empty).
pub(super) fn bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes.clone()),
        Value::SimpleString(text) => Some(text.clone().into_bytes()),
        Value::Nil => Some(Vec::new()),
        _ => None,
    }
}

/// One slot of `READ_QUEUE`'s reply: `{attempt, kind, order, owner, value,
/// changed}`.
pub(super) fn slot_from(name: &str, item: &Value) -> Option<Slot> {
    let Value::Array(fields) = item else { return None };
    let [member, kind, order, owner, value, changed] = fields.as_slice() else {
        return None;
    };
    let order: i64 = text(order)?.parse().ok()?;
    let changed: u64 = text(changed)?.parse().ok()?;
    Some(Slot {
        entry: Entry {
            key: layout::entry_key(name, &text(member)?),
            kind: layout::kind_from_label(&text(kind)?),
            order,
            token: FencingToken::new(order.unsigned_abs()),
            owner: Some(text(owner)?),
        },
        value: bytes(value)?,
        // Every write of a lock-mode entry takes a new number of the
        // lock's counter: that number is its version too.
        version: i64::try_from(changed).ok()?,
        changed,
    })
}

/// `READ_QUEUE`'s reply: `{slots, block}`.
pub(super) fn queue_from(name: &str, reply: &Value) -> Option<Queue> {
    let Value::Array(parts) = reply else { return None };
    let [Value::Array(slots), block] = parts.as_slice() else {
        return None;
    };
    let slots = slots
        .iter()
        .map(|item| slot_from(name, item))
        .collect::<Option<Vec<_>>>()?;
    let block = match block {
        Value::Nil => None,
        other => Some(bytes(other)?),
    };
    Some(Queue { slots, block })
}

/// A queue a hand-over's message carried (see `UPDATE_QUEUE`).
#[derive(Debug)]
pub(super) struct Carried {
    pub(super) queue: Queue,
    /// Whether it is the whole queue, not a prefix of it (see
    /// `BackendSession::read_queue_woken`).
    pub(super) whole: bool,
    /// How new it is: the hand-over's token. A hand-over sets at least one
    /// entry, above every number the lock's counter gave before, so of two
    /// hand-overs' queues the later one's is higher. (A whole queue's is
    /// its highest `changed`, which is that token.)
    pub(super) newness: u64,
}

/// The queue a hand-over's message carried (see `UPDATE_QUEUE`): `q1
/// <slots> ` (the whole queue) or `p1 <token> <slots> ` (a prefix), then
/// each slot's six fields as `READ_QUEUE` answers them and the block (`1`
/// and the field, or `0`), each field `<length>:<bytes>`.
pub(super) fn queue_from_packed(name: &str, packed: &[u8]) -> Option<Carried> {
    fn field<'p>(rest: &mut &'p [u8]) -> Option<&'p [u8]> {
        let colon = rest.iter().position(|&b| b == b':')?;
        let len: usize = std::str::from_utf8(&rest[..colon]).ok()?.parse().ok()?;
        let end = colon.checked_add(1)?.checked_add(len)?;
        let bytes = rest.get(colon + 1..end)?;
        *rest = &rest[end..];
        Some(bytes)
    }
    fn number<T: std::str::FromStr>(rest: &mut &[u8]) -> Option<T> {
        let space = rest.iter().position(|&b| b == b' ')?;
        let number = std::str::from_utf8(&rest[..space]).ok()?.parse().ok()?;
        *rest = &rest[space + 1..];
        Some(number)
    }
    let (mut rest, token) = match packed.strip_prefix(b"q1 ") {
        Some(rest) => (rest, None),
        None => {
            let mut rest = packed.strip_prefix(b"p1 ")?;
            let token: u64 = number(&mut rest)?;
            (rest, Some(token))
        }
    };
    let count: usize = number(&mut rest)?;
    let mut slots = Vec::with_capacity(count.min(crate::scripts::HANDED_QUEUE_MAX));
    for _ in 0..count {
        let mut fields = Vec::with_capacity(6);
        for _ in 0..6 {
            fields.push(Value::BulkString(field(&mut rest)?.to_vec()));
        }
        slots.push(slot_from(name, &Value::Array(fields))?);
    }
    let block = match rest.split_first()? {
        (b'0', []) => None,
        (b'1', mut tail) => {
            let block = field(&mut tail)?.to_vec();
            if !tail.is_empty() {
                return None;
            }
            Some(block)
        }
        _ => return None,
    };
    let queue = Queue { slots, block };
    let newness = token.unwrap_or_else(|| queue.slots.iter().map(|slot| slot.changed).max().unwrap_or(0));
    Some(Carried {
        queue,
        whole: token.is_none(),
        newness,
    })
}

pub(super) fn conflicts_arg(conflicts: Conflicts) -> &'static str {
    match conflicts {
        Conflicts::Exclusive => "exclusive",
        _ => "all",
    }
}

#[cfg(test)]
mod tests {
    use super::queue_from_packed;

    fn packed(fields: &[&[u8]], block: Option<&[u8]>) -> Vec<u8> {
        let mut out = format!("q1 {} ", fields.len() / 6).into_bytes();
        for field in fields {
            out.extend_from_slice(format!("{}:", field.len()).as_bytes());
            out.extend_from_slice(field);
        }
        match block {
            Some(block) => {
                out.extend_from_slice(format!("1{}:", block.len()).as_bytes());
                out.extend_from_slice(block);
            }
            None => out.push(b'0'),
        }
        out
    }

    const SLOT: [&[u8]; 6] = [b"next", b"lock mode", b"41", b"owner", b"granted: EX\n1:2", b"45"];

    #[test]
    fn a_packed_queue_reads_as_the_read_gives_it() {
        let carried = queue_from_packed("n", &packed(&SLOT, Some(b"lvb1 0 1 0 0\n"))).expect("a queue");
        assert!(carried.whole);
        assert_eq!(carried.newness, 45);
        let queue = carried.queue;
        assert_eq!(queue.slots.len(), 1);
        let slot = &queue.slots[0];
        assert_eq!(slot.entry.key, "{n}:e:next");
        assert_eq!((slot.entry.order, slot.version, slot.changed), (41, 45, 45));
        assert_eq!(slot.entry.owner.as_deref(), Some("owner"));
        assert_eq!(slot.value, b"granted: EX\n1:2");
        assert_eq!(queue.block.as_deref(), Some(&b"lvb1 0 1 0 0\n"[..]));
        let empty = queue_from_packed("n", &packed(&[], None)).expect("a queue").queue;
        assert!(empty.slots.is_empty() && empty.block.is_none());
    }

    #[test]
    fn a_packed_prefix_reads_as_a_prefix_as_new_as_its_token() {
        let mut prefix = b"p1 77 ".to_vec();
        prefix.extend_from_slice(&packed(&SLOT, None)[b"q1 ".len()..]);
        let carried = queue_from_packed("n", &prefix).expect("a prefix");
        assert!(!carried.whole);
        assert_eq!(carried.newness, 77);
        assert_eq!(carried.queue.slots.len(), 1);
        assert_eq!(carried.queue.slots[0].entry.order, 41);
        for end in 0..prefix.len() {
            assert!(queue_from_packed("n", &prefix[..end]).is_none(), "cut at {end}");
        }
        assert!(queue_from_packed("n", b"p1 x 0 0").is_none());
        assert!(queue_from_packed("n", b"p1 0 0").is_none());
    }

    #[test]
    fn a_packed_queue_cut_short_or_malformed_reads_as_none() {
        let whole = packed(&SLOT, None);
        for end in 0..whole.len() {
            assert!(queue_from_packed("n", &whole[..end]).is_none(), "cut at {end}");
        }
        let mut longer = whole.clone();
        longer.push(b'0');
        assert!(queue_from_packed("n", &longer).is_none());
        assert!(queue_from_packed("n", b"q1 2 0").is_none());
        assert!(queue_from_packed("n", b"q2 0 0").is_none());
        assert!(queue_from_packed("n", b"q1 0 199999999999999999999:").is_none());
        assert!(queue_from_packed("n", b"q1 1 18446744073709551615:x").is_none());
        let mut bad_order = SLOT;
        bad_order[2] = b"forty-one";
        assert!(queue_from_packed("n", &packed(&bad_order, None)).is_none());
    }
}
