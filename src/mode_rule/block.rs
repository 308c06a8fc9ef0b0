//! The lock value block: what a grant finds, and how it is stored.

use super::*;

/// A resource's lock value block as a grant or a conversion found it (see
/// [`ResourceGuard::value`](crate::ResourceGuard::value)).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LockValue {
    /// The value last written by a PW or EX holder (empty if never written).
    pub bytes: Vec<u8>,
    /// How many times it was written: rises by one with each write.
    pub sequence: u64,
    /// `false` when a PW or EX holder lost its lock involuntarily (its
    /// session expired, its process died) since the last write: the value
    /// may be stale, until the next PW or EX holder writes it.
    pub valid: bool,
}

/// The block as stored: `lvb1 <sequence> <valid> <holder order> <holder key
/// length>\n<holder key><bytes>`. The holder is the PW or EX entry granted
/// since the last write, if any: its entry gone without a release that
/// cleared it means an involuntary loss.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Block {
    pub(crate) value: LockValue,
    pub(crate) holder: Option<(String, i64)>,
}

impl Block {
    pub(crate) fn fresh() -> Block {
        Block {
            value: LockValue {
                bytes: Vec::new(),
                sequence: 0,
                valid: true,
            },
            holder: None,
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let (key, order) = self.holder.as_ref().map_or(("", 0), |(k, o)| (k.as_str(), *o));
        let mut out = Vec::with_capacity(40 + key.len() + self.value.bytes.len());
        out.extend_from_slice(b"lvb1 ");
        push_decimal(&mut out, self.value.sequence);
        out.extend_from_slice(if self.value.valid { b" 1 " } else { b" 0 " });
        if order < 0 {
            out.push(b'-');
        }
        push_decimal(&mut out, order.unsigned_abs());
        out.push(b' ');
        push_decimal(&mut out, key.len() as u64);
        out.push(b'\n');
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(&self.value.bytes);
        out
    }

    pub(crate) fn decode(stored: Option<&[u8]>) -> Block {
        let Some(stored) = stored else {
            return Block::fresh();
        };
        Self::parse(stored).unwrap_or(Block {
            value: LockValue {
                bytes: Vec::new(),
                sequence: 0,
                valid: false,
            },
            holder: None,
        })
    }

    pub(crate) fn parse(stored: &[u8]) -> Option<Block> {
        // Read by hand, as the states are (see `State::parse`): it takes
        // exactly what `str::split` and `str::parse` took
        // (`parse_block_reads_what_str_parse_read`).
        let line_end = stored.iter().position(|&b| b == b'\n')?;
        let head = &stored[..line_end];
        std::str::from_utf8(head).ok()?;
        let mut words = head.split(|&b| b == b' ');
        if words.next()? != b"lvb1" {
            return None;
        }
        let sequence = state::decimal(words.next()?)?;
        let valid = words.next()? == b"1";
        let order = state::signed(words.next()?)?;
        let key_len = usize::try_from(state::decimal(words.next()?)?).ok()?;
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

    /// The value as a holder granted now sees it, given the queue it was
    /// granted from.
    pub(crate) fn seen(&self, view: &View) -> LockValue {
        let mut value = self.value.clone();
        if let Some((key, order)) = &self.holder {
            let alive = view.slots.iter().any(|(slot, state)| {
                slot.entry.key == *key && slot.entry.order == *order && state.granted.is_some_and(LockMode::sole_writer)
            });
            value.valid &= alive;
        }
        value
    }

    /// Whether the block names a PW or EX holder whose entry is gone: it
    /// lost its lock without a release (or was dropped).
    pub(crate) fn lost_holder(&self, view: &View) -> bool {
        self.holder.as_ref().is_some_and(|(key, order)| {
            !view
                .slots
                .iter()
                .any(|(slot, _)| slot.entry.key == *key && slot.entry.order == *order)
        })
    }

    /// The block a grant outside PW and EX writes: `None` (no write) unless
    /// it names a lost holder, which it then clears, keeping the block not
    /// valid (a lock-delay after that loss is served once).
    pub(crate) fn cleared_if_lost(&self, view: &View) -> Option<Block> {
        self.lost_holder(view).then(|| Block {
            value: self.seen(view),
            holder: None,
        })
    }

    /// The block a PW or EX grant writes: it names the new holder, and
    /// keeps the knowledge that an earlier one was lost.
    pub(crate) fn granted_to(&self, view: &View, entry: &Entry) -> Block {
        Block {
            value: self.seen(view),
            holder: Some((entry.key.clone(), entry.order)),
        }
    }
}
