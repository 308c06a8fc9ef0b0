//! The Lua scripts: each one step on the server, touching only keys of one
//! lock's hash tag (so every script runs on one slot of a cluster).
//!
//! Keys of a lock `n` (see the crate docs for the whole layout):
//! `{n}:q` the queue (sorted set: attempt id scored by order), `{n}:seq` the
//! counter, `{n}:e:<attempt>` an entry (hash: kind, owner, order, value,
//! plain, and for a lock-mode entry changed; with a TTL), `{n}:c:<attempt>`
//! its channel, `{n}:joined` the channel an election candidate's append
//! publishes on, `{n}:l:<attempt>` the mark of an entry lost with its
//! owner's session, `{n}:b` the lock value block of a lock-mode resource,
//! and `n` itself, the plain key a mutex holder owns for clients of the
//! single-key lock.
//!
//! What an entry's channel carries says how the entry went, for a waiter's
//! lock-delay: `gone` (or `gone <attempt>`) when its owner removed it (a
//! release, a close, a cancelled acquire), `lost` (or `lost <attempt>`)
//! when it went with its owner's session (removed by a session its client
//! declared lost, or by another session, deleted under a holder whose plain
//! key a foreign client took, or reaped after it expired), and `value` when
//! its value changed. Every script that takes a lost entry's member out of
//! the queue also leaves its mark `{n}:l:<attempt>` for a minute, so that a
//! waiter that subscribed after the message still learns how it went from
//! the one look it takes after subscribing (`STATUS`); a release leaves
//! nothing.

use lockline::backend::WAITING_EX;
use redis::Script;

/// Functions shared by the scripts that read the queue. `mark_lost` marks
/// the entry of `member` lost with its owner's session for a minute (the
/// longest lock-delay), so that a waiter that subscribed after the message
/// reads it in its look at the entry (`STATUS`); `reap` takes the member of
/// an entry that expired (its owner stopped renewing) out of the queue,
/// marks it lost and tells its waiter, if any; `next_number` gives the
/// next number of the lock's counter (an append's order, a lock-mode
/// update's token), started or lifted to the server's clock first when
/// the counter is missing or was last started or lifted in another epoch
/// (see [`APPEND`]). Said here rather than in Lua comments: with replica
/// acknowledgement a writing script's text goes with every request.
const COMMON: &str = r#"
local function mark_lost(prefix, member)
  redis.call('SET', prefix .. 'l:' .. member, '', 'PX', 60000)
end

local function reap(q, prefix, member)
  redis.call('ZREM', q, member)
  mark_lost(prefix, member)
  redis.call('PUBLISH', prefix .. 'c:' .. member, 'lost')
end

-- One entry of a lock-mode queue as `READ_QUEUE` gives it, or nil (and
-- its member reaped) when the entry expired.
local function slot_of(q, prefix, member)
  local fields = redis.call('HMGET', prefix .. 'e:' .. member, 'kind', 'order', 'owner', 'value', 'changed')
  if not fields[1] then
    reap(q, prefix, member)
    return nil
  end
  local order = fields[2] or ''
  return {member, fields[1], order, fields[3] or '', fields[4] or '', fields[5] or order}
end

-- The queue of a lock-mode resource (see `READ_QUEUE`).
local function queue_of(q, prefix, block)
  local members = redis.call('ZRANGE', q, 0, -1)
  local out = {}
  for i = 1, #members do
    out[#out + 1] = slot_of(q, prefix, members[i])
  end
  return {out, redis.call('GET', block)}
end

-- The window of it an append reads (`AppendRequest::nearest`): the `count`
-- live entries nearest before the one of `order` (fewer only when the
-- queue has fewer: expired ones are reaped and passed over), that one and
-- those after it. `own`, when given, is the slot of the appended entry as
-- the script just wrote it, taken for its member without a read.
local function window_of(q, prefix, block, order, count, own)
  local before = {}
  local upper = '(' .. order
  while #before < count do
    local batch = redis.call('ZREVRANGEBYSCORE', q, upper, '-inf', 'WITHSCORES', 'LIMIT', 0, count)
    if #batch == 0 then break end
    for i = 1, #batch, 2 do
      upper = '(' .. batch[i + 1]
      local slot = slot_of(q, prefix, batch[i])
      if slot then
        before[#before + 1] = slot
        if #before >= count then break end
      end
    end
  end
  local out = {}
  for i = #before, 1, -1 do out[#out + 1] = before[i] end
  local rest = redis.call('ZRANGEBYSCORE', q, order, '+inf')
  for i = 1, #rest do
    if own and rest[i] == own[1] then
      out[#out + 1] = own
    else
      out[#out + 1] = slot_of(q, prefix, rest[i])
    end
  end
  return {out, redis.call('GET', block)}
end

-- The queue of a lock-mode resource from its first live entry through the
-- first request that waits for EX and was never granted (its value begins
-- with `waiting`), or through the last: `{slots, block, whole}` as
-- `queue_of` gives them, `whole` true when it read to the end; nil past
-- `limit` entries. Expired members are reaped and passed over. `known`,
-- when given, is the block's value, which the caller just wrote; `slots`
-- the slots of entries the caller read and wrote as they now are, by
-- member, taken without a read.
local function prefix_of(q, prefix, block, waiting, limit, known, slots)
  local function block_value()
    if known then return known end
    return redis.call('GET', block)
  end
  local out = {}
  local lower = '-inf'
  local size = 4
  while true do
    local batch = redis.call('ZRANGEBYSCORE', q, lower, '+inf', 'WITHSCORES', 'LIMIT', 0, size)
    size = 32
    if #batch == 0 then return {out, block_value(), true} end
    for i = 1, #batch, 2 do
      lower = '(' .. batch[i + 1]
      local slot = slots[batch[i]] or slot_of(q, prefix, batch[i])
      if slot then
        out[#out + 1] = slot
        if string.sub(slot[5], 1, #waiting) == waiting then
          return {out, block_value(), false}
        end
        if #out > limit then return nil end
      end
    end
  end
end

-- The nearest earlier live entries that conflict, nearest first, at most
-- `count`; reaps members whose entry expired.
local function nearest(q, prefix, order, conflicts, count)
  local out = {}
  local upper = '(' .. order
  while #out < count do
    local batch = redis.call('ZREVRANGEBYSCORE', q, upper, '-inf', 'WITHSCORES', 'LIMIT', 0, 32)
    if #batch == 0 then break end
    for i = 1, #batch, 2 do
      local member, score = batch[i], batch[i + 1]
      upper = '(' .. score
      local fields = redis.call('HMGET', prefix .. 'e:' .. member, 'kind', 'owner')
      if not fields[1] then
        reap(q, prefix, member)
      elseif conflicts == 'all' or fields[1] ~= 'read' then
        out[#out + 1] = {member, fields[1], score, fields[2]}
        if #out >= count then break end
      end
    end
  end
  return out
end

-- Takes the plain key for the entry `mine` (a string key, as SET NX PX
-- makes), or finds it already ours. False when a foreign client owns it.
-- A plain key left by a lockline entry that has since expired is taken over.
local function claim(plain, mine, ttl, prefix)
  local kind = redis.call('TYPE', plain)['ok']
  if kind == 'none' then
    redis.call('SET', plain, mine, 'PX', ttl)
    return true
  end
  if kind ~= 'string' then return false end
  local owner = redis.call('GET', plain)
  if owner == mine then return true end
  local entries = prefix .. 'e:'
  if string.sub(owner, 1, #entries) == entries and redis.call('EXISTS', owner) == 0 then
    redis.call('SET', plain, mine, 'PX', ttl)
    return true
  end
  return false
end

-- The remaining TTL of `entry`, which its own session renews: the plain key
-- taken for it lives as long as it does (not as long as the releaser's
-- session would have).
local function entry_ttl(entry, fallback)
  local ttl = redis.call('PTTL', entry)
  if ttl > 0 then return ttl end
  return fallback
end

-- At the head of the queue a mutex also needs the plain key; a foreign owner
-- of it stands in the queue as a blocker of order 0.
local function head(out, plain, entry, ttl, wants_plain, prefix)
  if #out == 0 and wants_plain == '1' then
    if claim(plain, entry, ttl, prefix) then
      redis.call('HSET', entry, 'plain', '1')
    else
      out[1] = {'', 'plain', '0', ''}
    end
  end
  return out
end

local function next_number(seq, epoch, now_epoch)
  if now_epoch == '' then
    if redis.replicate_commands then redis.replicate_commands() end
    local server = redis.pcall('INFO', 'server')
    local replication = redis.pcall('INFO', 'replication')
    if type(server) == 'string' and type(replication) == 'string' then
      local run = string.match(server, 'run_id:(%w+)') or ''
      now_epoch = run .. ':' .. (string.match(replication, 'master_replid:(%w+)') or '')
    else
      now_epoch = '-'
    end
  end
  local count = redis.call('GET', seq)
  local lift = not count
  if not lift and now_epoch ~= '-' then lift = redis.call('GET', epoch) ~= now_epoch end
  if lift then
    if redis.replicate_commands then redis.replicate_commands() end
    local now = redis.call('TIME')
    local clock = now[1] .. string.format('%06d', tonumber(now[2]))
    if not count or not string.find(count, '^%d+$') or #count < #clock or (#count == #clock and count < clock) then
      redis.call('SET', seq, clock)
    end
    if now_epoch ~= '-' then redis.call('SET', epoch, now_epoch) end
  end
  return string.format('%d', redis.call('INCR', seq))
end
"#;

/// KEYS: queue, counter, plain key, the counter's epoch (`{n}:run`), the
/// lock value block (`{n}:b`), and on a single node the session key (a
/// cluster would refuse it, in another slot): without it on the server the
/// script fails with `NOSESSION` and writes nothing.
/// ARGV: prefix (`{n}:`), attempt, kind, owner, value, ttl ms, conflicts
/// (`all`/`exclusive`), count, wants plain, `1` to read the lock-mode queue
/// too (as `READ_QUEUE` does, a third item of the answer), and the epoch of the server the
/// request was sent to, `<run_id>:<master_replid>` (learned on its
/// connection before anything else was sent on it; empty: read here, with
/// `INFO`; `-`: unknown, the user may not run `INFO`, and the counter is
/// only started when missing, never lifted), and for a lock-mode entry the
/// window of the queue to read (0: all of it; see `window_of`). Returns
/// `{order, nearest}` (the order as a string), for a lock-mode entry
/// `{order, {}, queue}` (it decides from the queue alone); a retried append
/// finds its own entry.
///
/// The counter is started from the server's clock, `TIME` in microseconds
/// (seconds followed by six digits of microseconds, put together as text,
/// never through a Lua float), when it does not exist (the lock's first
/// use, or its data lost with a restart without persistence), and lifted
/// to the clock (never lowered) when it was last started or lifted in
/// another epoch than this one: `{n}:run` is not this server's epoch. A
/// restart that lost the latest writes (an append-only file fsynced every
/// second, or never, and a machine that lost what was not fsynced) can
/// bring back a counter below tokens already handed out; it also changes
/// the `run_id`, so the first append on each lock after it lifts the
/// counter above them. So does a promoted replica that lacks the latest
/// increments (another process), as long as its clock is ahead of them.
/// Every earlier token is at most the clock when its counter was started
/// or last lifted plus the grants made since, which stays below the clock
/// as long as the clock did not step back and fewer than a million grants
/// (appends and lock-mode writes) a second were made on the lock. Within
/// one epoch the counter is only incremented, by one an append or a write
/// of a lock-mode entry (an update of the queue, a `SET_VALUE`). `TIME` and `INFO` make the script
/// non-deterministic, which effects replication allows (the default from
/// Redis 5, the only mode from Redis 7); `redis.replicate_commands()`,
/// called before any write, turns it on for Redis 3.2 and 4. The order is
/// kept as text in the script: Lua 5.1 writes a number concatenated into a
/// string with 14 significant digits, too few for a clock in microseconds.
const APPEND: &str = r#"
local q, seq, plain, epoch = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, attempt = ARGV[1], ARGV[2]
-- A session this server does not have (it restarted without its data, a
-- replica without the key was promoted, the data was flushed, or the
-- session ended) appends nothing.
if KEYS[6] and redis.call('EXISTS', KEYS[6]) == 0 then
  return redis.error_reply('NOSESSION the server does not have this session')
end
local entry = prefix .. 'e:' .. attempt
local order = redis.call('HGET', entry, 'order')
local own = nil
if not order then
  -- An append that arrives after its attempt was abandoned creates nothing.
  if redis.call('EXISTS', prefix .. 'x:' .. attempt) == 1 then
    return redis.error_reply('ABANDONED this acquire attempt was abandoned')
  end
  local queue_type = redis.call('TYPE', q)['ok']
  if queue_type ~= 'none' and queue_type ~= 'zset' then
    return redis.error_reply('WRONGTYPE the queue key holds a ' .. queue_type)
  end
  order = next_number(seq, epoch, ARGV[11])
  redis.call('HSET', entry, 'kind', ARGV[3], 'owner', ARGV[4], 'order', order, 'value', ARGV[5])
  redis.call('PEXPIRE', entry, ARGV[6])
  redis.call('ZADD', q, order, attempt)
  if ARGV[3] == 'election' then redis.call('PUBLISH', prefix .. 'joined', order) end
  -- Its slot as `slot_of` would read it back (never written by an update).
  own = {attempt, ARGV[3], order, ARGV[4], ARGV[5], order}
end
if ARGV[10] == '1' then
  -- A lock-mode entry decides from the queue (its window) alone: no
  -- nearest entries, no plain key.
  local window = tonumber(ARGV[12] or '0')
  if window > 0 then return {order, {}, window_of(q, prefix, KEYS[5], order, window, own)} end
  return {order, {}, queue_of(q, prefix, KEYS[5])}
end
local out = nearest(q, prefix, order, ARGV[7], tonumber(ARGV[8]))
return {order, head(out, plain, entry, ARGV[6], ARGV[9], prefix)}
"#;

/// KEYS: queue, plain key. ARGV: prefix, attempt, order, conflicts, count,
/// ttl ms, wants plain. Returns `{0}` when the entry is gone, else `{1, nearest}`.
const EARLIER: &str = r#"
local q, plain = KEYS[1], KEYS[2]
local prefix, attempt = ARGV[1], ARGV[2]
local entry = prefix .. 'e:' .. attempt
local order = redis.call('HGET', entry, 'order')
if not order or order ~= ARGV[3] then return {0} end
local out = nearest(q, prefix, order, ARGV[4], tonumber(ARGV[5]))
return {1, head(out, plain, entry, ARGV[6], ARGV[7], prefix)}
"#;

/// KEYS: queue, plain key. ARGV: prefix, attempt, order (empty: any, an
/// abandoned attempt, which also leaves a tombstone `{n}:x:<attempt>` for a
/// TTL so that its append, if still in flight, creates nothing), owner, ttl
/// ms, `lost` when the entry goes with its owner's session (absent or empty
/// for a release: the handoff's request is the same as without lock-delay),
/// and `keyless` when the owner's session key is already gone from this
/// single node: an append still in flight is then refused by `APPEND`
/// itself, and an abandoned attempt needs no tombstone.
/// Deletes the entry if it is still that one, gives up the plain key if the
/// entry owned it, and wakes the entry's one waiter. An entry found already
/// gone but still queued expired (or was deleted by another client): its
/// member is reaped, marked lost, and its waiter told `lost`. The message is `gone` (`lost`, with the entry
/// marked lost, when its owner's session was lost), or `gone <attempt>`
/// (`lost <attempt>`) when the queue's first live entry
/// is the one right after the deleted one (so it waits on this channel) and
/// now holds by the exclusive rule (a mutex, write lock or candidate at the
/// head; a mutex once it has the plain key, which this step takes for it):
/// the one read that decides, made here, so the woken successor needs none.
/// Returns 1 if it deleted; -1 if the entry was gone and did not go by a
/// removal of its owner (its member was still queued, reaped now, or was
/// reaped and marked lost before); 0 otherwise (gone by such a removal, or
/// another entry).
const REMOVE: &str = r#"
local q, plain = KEYS[1], KEYS[2]
local prefix, attempt = ARGV[1], ARGV[2]
local entry = prefix .. 'e:' .. attempt
if ARGV[3] == '' and ARGV[7] ~= 'keyless' then
  -- An abandoned attempt: an append of it still in flight must not land.
  redis.call('SET', prefix .. 'x:' .. attempt, '', 'PX', ARGV[5])
end
local fields = redis.call('HMGET', entry, 'order', 'owner', 'plain')
if not fields[1] then
  if redis.pcall('ZREM', q, attempt) == 1 then
    mark_lost(prefix, attempt)
    redis.call('PUBLISH', prefix .. 'c:' .. attempt, 'lost')
    return -1
  end
  if redis.call('EXISTS', prefix .. 'l:' .. attempt) == 1 then return -1 end
  return 0
end
if (ARGV[3] ~= '' and fields[1] ~= ARGV[3]) or fields[2] ~= ARGV[4] then return 0 end
redis.call('DEL', entry)
redis.pcall('ZREM', q, attempt)
if fields[3] == '1' and redis.call('TYPE', plain)['ok'] == 'string' and redis.call('GET', plain) == entry then
  redis.call('DEL', plain)
end
local word = 'gone'
if ARGV[6] == 'lost' then
  word = 'lost'
  mark_lost(prefix, attempt)
end
local message = word
while redis.call('TYPE', q)['ok'] == 'zset' do
  local first = redis.call('ZRANGE', q, 0, 0, 'WITHSCORES')
  if #first == 0 then break end
  local head = prefix .. 'e:' .. first[1]
  local kind = redis.call('HGET', head, 'kind')
  if not kind then
    reap(q, prefix, first[1])
  else
    -- Only the entry right after the one deleted waits on its channel:
    -- an earlier head (the holder, or one waiting for something else) is
    -- not announced.
    if tonumber(first[2]) < tonumber(fields[1]) then
      break
    end
    if kind == 'write' or kind == 'election' then
      message = word .. ' ' .. first[1]
    elseif kind == 'mutex' and claim(plain, head, entry_ttl(head, ARGV[5]), prefix) then
      redis.call('HSET', head, 'plain', '1')
      message = word .. ' ' .. first[1]
    end
    break
  end
end
redis.call('PUBLISH', prefix .. 'c:' .. attempt, message)
return 1
"#;

/// KEYS: queue, plain key. ARGV: prefix. Every live entry, first-created
/// first, as `{attempt, kind, order, owner}`; reaps expired members (each
/// marked lost, its waiter told so).
const LIST: &str = r#"
local q = KEYS[1]
local prefix = ARGV[1]
local members = redis.call('ZRANGE', q, 0, -1, 'WITHSCORES')
local out = {}
for i = 1, #members, 2 do
  local member, score = members[i], members[i + 1]
  local fields = redis.call('HMGET', prefix .. 'e:' .. member, 'kind', 'owner')
  if fields[1] then
    out[#out + 1] = {member, fields[1], score, fields[2]}
  else
    reap(q, prefix, member)
  end
end
return out
"#;

/// KEYS: entry. ARGV: order. The entry's remaining TTL in ms (`PTTL`, -1:
/// none); when it is gone (or is another entry), -3 if it went with its
/// owner's session (its member is still queued: it expired; or its lost
/// mark is there), -2 if its owner let it go (every script that takes a
/// member out of the queue deletes its entry with it, and marks it lost
/// unless its owner let it go). The queue `{n}:q` and the mark
/// `{n}:l:<attempt>` are read from the entry key's positions (`{n}:` up to
/// the first `}`, which no name holds, then `e:<attempt>`): keys of the
/// entry's slot, and a look the same size on the wire as before lock-delay.
const STATUS: &str = r#"
if redis.call('HGET', KEYS[1], 'order') ~= ARGV[1] then
  local close = string.find(KEYS[1], '}', 1, true)
  local prefix = string.sub(KEYS[1], 1, close + 1)
  local attempt = string.sub(KEYS[1], close + 4)
  if redis.call('ZSCORE', prefix .. 'q', attempt) or redis.call('EXISTS', prefix .. 'l:' .. attempt) == 1 then
    return -3
  end
  return -2
end
return redis.call('PTTL', KEYS[1])
"#;

/// KEYS: entry, plain key. ARGV: ttl ms, queue, channel, attempt. Renews an
/// entry that owns the plain key, and the plain key with it. When a foreign
/// client has taken the plain key (it was deleted under the holder), the
/// holder's entry is deleted: the lock is no longer held, and was lost (its
/// waiter is told `lost`, and the entry marked lost at `{n}:l:<attempt>`,
/// `{n}:` being the entry key before `e:<attempt>`). Returns 1 when
/// renewed, 0 when the entry is gone.
const RENEW_HOLDER: &str = r#"
local entry, plain = KEYS[1], KEYS[2]
if redis.call('PEXPIRE', entry, ARGV[1]) == 0 then return 0 end
local kind = redis.call('TYPE', plain)['ok']
if kind == 'none' then
  redis.call('SET', plain, entry, 'PX', ARGV[1])
  return 1
end
if kind == 'string' and redis.call('GET', plain) == entry then
  redis.call('PEXPIRE', plain, ARGV[1])
  return 1
end
redis.call('DEL', entry)
redis.call('ZREM', ARGV[2], ARGV[4])
local prefix = string.sub(entry, 1, #entry - #ARGV[4] - 2)
redis.call('SET', prefix .. 'l:' .. ARGV[4], '', 'PX', 60000)
redis.call('PUBLISH', ARGV[3], 'lost')
return 0
"#;

/// KEYS: entry, counter, the counter's epoch. ARGV: order, value, channel,
/// the epoch of the server the request was sent to (as for `APPEND`).
/// Replaces the value of the entry if it is still that one and tells its
/// watchers. A lock-mode entry's `changed` (its version, see
/// `READ_QUEUE`) takes the counter's next number, as an update of the
/// queue does; other kinds leave the counter alone. Returns 1 if set.
const SET_VALUE: &str = r#"
local fields = redis.call('HMGET', KEYS[1], 'order', 'kind')
if fields[1] ~= ARGV[1] then return 0 end
if fields[2] == 'lock mode' then
  redis.call('HSET', KEYS[1], 'value', ARGV[2], 'changed', next_number(KEYS[2], KEYS[3], ARGV[4]))
else
  redis.call('HSET', KEYS[1], 'value', ARGV[2])
end
redis.call('PUBLISH', ARGV[3], 'value')
return 1
"#;

/// KEYS: entry. ARGV: order. `{1, value, ttl ms}` (`PTTL`: -1 without a
/// TTL), or when the entry is gone (or is another entry) `{0, how}`, how
/// it went as `STATUS` tells it: -3 with its owner's session, -2 let go by
/// its owner. A value watcher's one look, which also answers a lock-delay
/// with no request of its own.
const GET_VALUE: &str = r#"
local fields = redis.call('HMGET', KEYS[1], 'order', 'value')
if fields[1] ~= ARGV[1] then
  local close = string.find(KEYS[1], '}', 1, true)
  local prefix = string.sub(KEYS[1], 1, close + 1)
  local attempt = string.sub(KEYS[1], close + 4)
  if redis.call('ZSCORE', prefix .. 'q', attempt) or redis.call('EXISTS', prefix .. 'l:' .. attempt) == 1 then
    return {0, -3}
  end
  return {0, -2}
end
return {1, fields[2] or '', redis.call('PTTL', KEYS[1])}
"#;

/// KEYS: queue, the lock value block (`{n}:b`). ARGV: prefix. The queue of
/// a lock-mode resource in one read: `{slots, block}`, each slot `{attempt,
/// kind, order, owner, value, changed}`, first-created first (`changed`:
/// the counter's number taken by the last write of the entry's value, or
/// its order when none was made; it is also the entry's version); the
/// block is nil when it was never written. Reaps expired members (each
/// marked lost, its waiter told so), as `LIST` does.
const READ_QUEUE: &str = r#"
return queue_of(KEYS[1], ARGV[1], KEYS[2])
"#;

/// The most entries a hand-over's message carries, whole queue or prefix
/// (see [`UPDATE_QUEUE`]): past it, the waiters it woke read the queue
/// themselves.
pub(crate) const HANDED_QUEUE_MAX: usize = 256;

/// KEYS: queue, counter, the counter's epoch, the lock value block. ARGV:
/// prefix, the caller's session id, `1` to write the block (`0`: leave
/// it), the block, then four lists, each its length followed by its
/// items: the entries that must be unchanged (`attempt, order, version`),
/// those that must be present at any version (`attempt, order`), the
/// values to set (`attempt, order, value`), the entries to delete
/// (`attempt, order`); last, the epoch of the server the request was sent
/// to (as for `APPEND`).
///
/// Checks first, writing nothing: every listed entry must still be that
/// entry (its order), and every unchanged one at its version (`changed`,
/// or its order when never set). Then takes the counter's next number
/// (the token), sets each value with `changed` = the token and publishes
/// `value <token> <value>` on that entry's channel only (its value
/// watcher, which decides from it without a look) — but for another
/// session's grant of a waiting request in the mode it asked for (a
/// hand-over's), which says nothing: it lets no watcher on (see
/// [`lockline::backend::only_owner_unblocks`]); the request's owner has
/// no holder's watch on it yet (a waiting request's own session watches
/// its going without a subscription), and learns of the grant from the
/// hand-over's message on the deleted entry's channel. A mark of a
/// waiter on a holder's entry is said, as before: the holder's watch
/// for blocking notifications hears it. Then it deletes each
/// entry to delete with its member (publishing `gone` on its channel, or
/// `lost`, with the entry marked lost, when another session owns it, as a
/// removal does), and writes the block. Returns `{1, token}`, or `{0}`
/// when a check failed.
///
/// A hand-over (an update that both sets values and deletes entries)
/// says more on the channel of each entry it deleted: `gone ~ ` and the
/// queue as it left it, read after its writes in the same script: from its
/// first entry through the first request that waits for EX and was never
/// granted (its value begins with [`WAITING_EX`]; every entry after it is
/// an NL holder or waits behind it), at most [`HANDED_QUEUE_MAX`] entries.
/// When that is the whole queue, `q1 <slots> `; when it stopped at such a
/// request, `p1 <token> <slots> ` (a prefix, which a client that knows
/// only `q1` does not take). Then each slot's six fields of `READ_QUEUE`
/// and the block, if any, after a `1`, each field as `<length>:<bytes>`;
/// a `0` for no block. The waiter it woke then decides without a read of
/// its own (from a prefix only that it was handed the lock, or what it
/// waits on; see `BackendSession::read_queue_woken`). A client that knows
/// only `gone` takes the word after it as a mutex's new head, which names
/// no entry of its own.
const UPDATE_QUEUE: &str = r#"
local q, seq, epoch, block = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, me = ARGV[1], ARGV[2]
local queue_type = redis.call('TYPE', q)['ok']
if queue_type ~= 'none' and queue_type ~= 'zset' then
  return redis.error_reply('WRONGTYPE the queue key holds a ' .. queue_type)
end
local i = 5
local count = tonumber(ARGV[i])
i = i + 1
-- Each entry checked so far, by member: the order it was found at, its
-- owner, and for an unchanged one its kind and value. An entry to set or
-- delete that was checked already is not read again.
local checked = {}
for k = 1, count do
  local fields = redis.call('HMGET', prefix .. 'e:' .. ARGV[i], 'order', 'changed', 'kind', 'owner', 'value')
  if not fields[1] or fields[1] ~= ARGV[i + 1] or (fields[2] or fields[1]) ~= ARGV[i + 2] then return {0} end
  checked[ARGV[i]] = {fields[1], fields[3], fields[4] or '', fields[5]}
  i = i + 3
end
count = tonumber(ARGV[i])
i = i + 1
for k = 1, count do
  local fields = redis.call('HMGET', prefix .. 'e:' .. ARGV[i], 'order', 'owner')
  if fields[1] ~= ARGV[i + 1] then return {0} end
  checked[ARGV[i]] = {fields[1], nil, fields[2] or ''}
  i = i + 2
end
local sets = i + 1
count = tonumber(ARGV[i])
i = i + 1
for k = 1, count do
  local seen = checked[ARGV[i]]
  if not (seen and seen[1] == ARGV[i + 1]) and redis.call('HGET', prefix .. 'e:' .. ARGV[i], 'order') ~= ARGV[i + 1] then
    return {0}
  end
  i = i + 3
end
local deletes = i + 1
count = tonumber(ARGV[i])
i = i + 1
local owners = {}
for k = 1, count do
  local seen = checked[ARGV[i]]
  if seen and seen[1] == ARGV[i + 1] and seen[3] then
    owners[k] = seen[3]
  else
    local fields = redis.call('HMGET', prefix .. 'e:' .. ARGV[i], 'order', 'owner')
    if not fields[1] or fields[1] ~= ARGV[i + 1] then return {0} end
    owners[k] = fields[2] or ''
  end
  i = i + 2
end
local token = next_number(seq, epoch, ARGV[#ARGV])
-- The slots of the entries set whose kind and owner were read, as
-- `slot_of` would now read them.
local written = {}
local modes = LOCK_MODE_SET
local function modes_of(value)
  local g, r = string.match(value or '', '^dlm2 ([-A-Z]+) ([A-Z]+) %d+ %d+ %d+ %d+ %x+$')
  if modes[r] and (g == '-' or modes[g]) then return g, r end
end
i = sets
while i < deletes - 1 do
  local key = prefix .. 'e:' .. ARGV[i]
  local seen = checked[ARGV[i]]
  local quiet = false
  if seen and seen[2] and seen[3] ~= me then
    local g, r = modes_of(ARGV[i + 2])
    if g and g == r then
      local was, asked = modes_of(seen[4])
      quiet = was == '-' and asked == r
    end
  end
  redis.call('HSET', key, 'value', ARGV[i + 2], 'changed', token)
  if not quiet then
    redis.call('PUBLISH', prefix .. 'c:' .. ARGV[i], 'value ' .. token .. ' ' .. ARGV[i + 2])
  end
  if seen and seen[2] then
    written[ARGV[i]] = {ARGV[i], seen[2], seen[1], seen[3], ARGV[i + 2], token}
  end
  i = i + 3
end
i = deletes
local told = {}
for k = 1, #owners do
  local attempt = ARGV[i]
  redis.call('DEL', prefix .. 'e:' .. attempt)
  redis.call('ZREM', q, attempt)
  local word = 'gone'
  if owners[k] ~= me then
    word = 'lost'
    mark_lost(prefix, attempt)
  end
  told[k] = {prefix .. 'c:' .. attempt, word}
  i = i + 2
end
if ARGV[3] == '1' then redis.call('SET', block, ARGV[4]) end
local handed = nil
local read = nil
if sets < deletes - 1 and #owners > 0 then
  local block_written = nil
  if ARGV[3] == '1' then block_written = ARGV[4] end
  read = prefix_of(q, prefix, block, WAITING_EX, HANDED_QUEUE_MAX, block_written, written)
end
if read then
  local out = {'gone ~ q1 ', #read[1], ' '}
  if not read[3] then out = {'gone ~ p1 ', token, ' ', #read[1], ' '} end
  for s = 1, #read[1] do
    for f = 1, 6 do
      local field = read[1][s][f]
      out[#out + 1] = #field .. ':' .. field
    end
  end
  if read[2] then
    out[#out + 1] = '1' .. #read[2] .. ':' .. read[2]
  else
    out[#out + 1] = '0'
  end
  handed = table.concat(out)
end
for k = 1, #told do
  local word = told[k][2]
  if word == 'gone' and handed then word = handed end
  redis.call('PUBLISH', told[k][1], word)
end
return {1, token}
"#;

/// KEYS: entry, then the keys written. ARGV: order, then one op per key
/// (`put`/`del`), then the values of the puts in order. Applies every write
/// if the entry is still that one. Returns 1 if written.
const WRITE_IF_HELD: &str = r#"
if redis.call('HGET', KEYS[1], 'order') ~= ARGV[1] then return 0 end
local n = #KEYS - 1
local value = n + 2
for i = 1, n do
  if ARGV[i + 1] == 'put' then
    redis.call('SET', KEYS[i + 1], ARGV[value])
    value = value + 1
  else
    redis.call('DEL', KEYS[i + 1])
  end
end
return 1
"#;

/// The scripts, hashed once per backend.
pub(crate) struct Scripts {
    pub(crate) append: Script,
    pub(crate) earlier: Script,
    pub(crate) remove: Script,
    pub(crate) list: Script,
    pub(crate) status: Script,
    pub(crate) renew_holder: Script,
    pub(crate) set_value: Script,
    pub(crate) get_value: Script,
    pub(crate) write_if_held: Script,
    pub(crate) read_queue: Script,
    pub(crate) update_queue: Script,
}

/// The six modes' labels as a Lua set (`{NL=1, …}`).
fn lua_modes() -> String {
    let labels: Vec<String> = lockline::LockMode::ALL
        .into_iter()
        .map(|mode| format!("{}=1", mode.label()))
        .collect();
    format!("{{{}}}", labels.join(", "))
}

/// `bytes` as a Lua string literal.
fn lua_string(bytes: &[u8]) -> String {
    let mut out = String::from("'");
    for &b in bytes {
        out.push_str(&format!("\\{b:03}"));
    }
    out.push('\'');
    out
}

impl Scripts {
    pub(crate) fn new() -> Self {
        let with_common = |body: &str| Script::new(&format!("{COMMON}\n{body}"));
        Scripts {
            append: with_common(APPEND),
            earlier: with_common(EARLIER),
            remove: with_common(REMOVE),
            list: with_common(LIST),
            status: Script::new(STATUS),
            renew_holder: Script::new(RENEW_HOLDER),
            set_value: with_common(SET_VALUE),
            get_value: Script::new(GET_VALUE),
            write_if_held: Script::new(WRITE_IF_HELD),
            read_queue: with_common(READ_QUEUE),
            update_queue: with_common(
                &UPDATE_QUEUE
                    .replace("HANDED_QUEUE_MAX", &HANDED_QUEUE_MAX.to_string())
                    .replace("LOCK_MODE_SET", &lua_modes())
                    .replace("WAITING_EX", &lua_string(WAITING_EX)),
            ),
        }
    }
}
