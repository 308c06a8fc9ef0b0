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

pub(super) fn conflicts_arg(conflicts: Conflicts) -> &'static str {
    match conflicts {
        Conflicts::Exclusive => "exclusive",
        _ => "all",
    }
}
