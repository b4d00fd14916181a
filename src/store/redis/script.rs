//! The Lua scripts that read and change the fleet's shared state.
//!
//! Every decision that more than one instance could take at once is taken
//! inside Redis, atomically, by one script on one breaker's keys and its
//! shard's index (one hash tag, so one Cluster slot): counting a failure
//! and opening at the threshold (once enough instances are failing),
//! writing an opening, taking the probe lock, counting a probe's success
//! and closing. Times are Redis's own (key expiries and `TIME`), never an
//! instance's clock, so clock skew between instances cannot shorten or
//! stretch an open period.
//!
//! Every change of what the shard's index says (a breaker opened or
//! closed, a failure count that became non-zero or zero) writes the
//! breaker's entry in the index and adds one to the shard's version, in
//! the same script. An entry reads `o <version> <generation> <attempt>
//! <open until> <kept until>` (open) or `c <version> <failures> <until>`
//! (failures counted); `<version>` is the shard's version when it was
//! written, and times are Redis's, in milliseconds. Openings and closings
//! are also published, with the version they made.
//!
//! Every operation answers with six integers, `{kind, generation, ms,
//! attempt, failures, version}` (`version`: the shard's, which the answer
//! holds at):
//!
//! | kind | meaning | `ms` |
//! | --- | --- | --- |
//! | 0 | closed | 0 |
//! | 1 | open (or half-open when `ms` is 0, and nobody holds the probe lock for the caller) | what is left of the open period |
//! | 2 | half-open, and the caller holds the probe lock | 0 |
//! | 3 | half-open, another instance holds the probe lock | what is left of its lease |
//! | 4 | closed: the caller's opening was declined (fewer than `quorum` instances failing) | 0 |

use redis::{Script, ScriptInvocation};

use std::time::Duration;

use super::keys::{Keys, Shard};
use crate::store::fleet::{Args, Op, Reply};
use crate::store::{FleetOpening, FleetState};
use crate::Control;

/// `KEYS`: record, wait, min_open, failures, generation, probe_lock, votes,
/// index, version. `ARGV`: op, channel, escaped name, open_ms,
/// min_open_ms, keep_ms, attempt, known generation, threshold, window_ms,
/// lease_ms, instance (the probe lock's holder), successes, quorum,
/// sharded publish (`1`), voter (whose failures count toward the quorum),
/// and for `control` the control's kind.
const LUA: &str = r#"
local op = ARGV[1]
local name = ARGV[3]
local function num(x) return string.format('%.0f', x) end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- One more on every change of the shard's index. A lost counter starts
-- again from Redis's clock in microseconds, far above any value it had.
local function moved()
  if redis.call('EXISTS', KEYS[9]) == 0 then
    local t = redis.call('TIME')
    redis.call('SET', KEYS[9], num(tonumber(t[1]) * 1000000 + tonumber(t[2])))
  end
  return redis.call('INCR', KEYS[9])
end
local function publish(message)
  if ARGV[15] == '1' then
    redis.call('SPUBLISH', ARGV[2], message)
  else
    redis.call('PUBLISH', ARGV[2], message)
  end
end
local function failures()
  return tonumber(redis.call('HGET', KEYS[4], 'n') or '0')
end
local function state()
  local rec = redis.call('HMGET', KEYS[1], 'gen', 'attempt')
  if not rec[1] then
    return {0, 0, 0, 0, failures()}
  end
  local wait = redis.call('PTTL', KEYS[2])
  if wait < 0 then wait = 0 end
  return {1, tonumber(rec[1]), wait, tonumber(rec[2]), 0}
end
-- Instances failing at once: those whose failures the count holds, those
-- whose own breaker opened (a vote, for its open period), and the caller.
local function failing(now)
  local seen, n = {}, 0
  for _, field in ipairs(redis.call('HKEYS', KEYS[4])) do
    if string.sub(field, 1, 2) == 'i:' then
      local who = string.sub(field, 3)
      if not seen[who] then seen[who] = true; n = n + 1 end
    end
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', num(now))
  for _, who in ipairs(redis.call('ZRANGE', KEYS[7], 0, -1)) do
    if not seen[who] then seen[who] = true; n = n + 1 end
  end
  if not seen[ARGV[16]] then n = n + 1 end
  return n
end
local function open(attempt)
  -- Generations never repeat: a lost counter starts again from Redis's
  -- clock in milliseconds, above any number it handed out before.
  if redis.call('EXISTS', KEYS[5]) == 0 then
    redis.call('SET', KEYS[5], num(now_ms()))
  end
  local g = redis.call('INCR', KEYS[5])
  redis.call('PEXPIRE', KEYS[5], 604800000)
  redis.call('HSET', KEYS[1], 'gen', g, 'attempt', attempt, 'ok', 0)
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[4])
  -- `min_open` counts from the first opening of an outage, not from
  -- each reopening.
  if tonumber(ARGV[5]) > 0 then
    redis.call('SET', KEYS[3], '1', 'PX', ARGV[5], 'NX')
  end
  redis.call('DEL', KEYS[4], KEYS[6], KEYS[7])
  local now = now_ms()
  local v = moved()
  redis.call('HSET', KEYS[8], name, 'o ' .. num(v) .. ' ' .. num(g) .. ' ' .. attempt .. ' '
    .. num(now + tonumber(ARGV[4])) .. ' ' .. num(now + tonumber(ARGV[6])))
  publish('open ' .. num(v) .. ' ' .. num(g) .. ' ' .. ARGV[4] .. ' ' .. attempt .. ' '
    .. ARGV[6] .. ' ' .. name)
  return {1, g, tonumber(ARGV[4]), attempt, 0}
end
local quorum = tonumber(ARGV[14])
-- The operation's answer: {kind, generation, ms, attempt, failures}.
local function run()
  if op == 'state' then
    return state()
  elseif op == 'fail' then
    if redis.call('EXISTS', KEYS[1]) == 1 then return state() end
    local n = redis.call('HINCRBY', KEYS[4], 'n', 1)
    if quorum > 1 then redis.call('HSET', KEYS[4], 'i:' .. ARGV[16], 1) end
    redis.call('PEXPIRE', KEYS[4], ARGV[10])
    local now = now_ms()
    if n >= tonumber(ARGV[9]) and (quorum <= 1 or failing(now) >= quorum) then
      return open(0)
    end
    -- A count that becomes non-zero is news; a count that grows is not
    -- (its entry is kept current, the version stays).
    local v = redis.call('GET', KEYS[9]) or '0'
    if n == 1 then v = num(moved()) end
    redis.call('HSET', KEYS[8], name, 'c ' .. v .. ' ' .. n .. ' ' .. num(now + tonumber(ARGV[10])))
    return {0, 0, 0, 0, n}
  elseif op == 'reset' then
    if redis.call('EXISTS', KEYS[1]) == 0 then
      local gone = redis.call('DEL', KEYS[4]) + redis.call('HDEL', KEYS[8], name)
      if gone > 0 then moved() end
    end
    return state()
  elseif op == 'open' then
    local g = redis.call('HGET', KEYS[1], 'gen')
    if g and (g ~= ARGV[8] or redis.call('EXISTS', KEYS[2]) == 1) then return state() end
    -- A new opening (not the reopening after a failed probe) needs
    -- `quorum` instances failing; below it, the caller's opening is a vote,
    -- for its open period and the probe lease.
    if not g and quorum > 1 then
      local now = now_ms()
      if failing(now) < quorum then
        local life = tonumber(ARGV[4]) + tonumber(ARGV[11])
        redis.call('ZADD', KEYS[7], num(now + life), ARGV[16])
        if redis.call('PTTL', KEYS[7]) < life then redis.call('PEXPIRE', KEYS[7], num(life)) end
        return {4, 0, 0, 0, failures()}
      end
    end
    return open(tonumber(ARGV[7]))
  elseif op == 'probe' then
    local s = state()
    if s[1] == 0 or s[3] > 0 then return s end
    if redis.call('GET', KEYS[6]) == ARGV[12] then
      -- The caller's lease ran out without a verdict: its turn is over.
      redis.call('DEL', KEYS[6])
      return {3, s[2], 0, s[4], 0}
    end
    if redis.call('SET', KEYS[6], ARGV[12], 'NX', 'PX', ARGV[11]) then
      return {2, s[2], 0, s[4], 0}
    end
    local lease = redis.call('PTTL', KEYS[6])
    if lease == -1 then
      -- A lock without an expiry was not set by this script: give it one.
      redis.call('PEXPIRE', KEYS[6], ARGV[11])
      lease = tonumber(ARGV[11])
    end
    if lease < 0 then lease = 0 end
    return {3, s[2], lease, s[4], 0}
  elseif op == 'probe_ok' then
    local s = state()
    if s[1] == 0 or tostring(s[2]) ~= ARGV[8] or s[3] > 0 then return s end
    local ok = redis.call('HINCRBY', KEYS[1], 'ok', 1)
    if ok >= tonumber(ARGV[13]) and redis.call('EXISTS', KEYS[3]) == 0 then
      redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], KEYS[7])
      redis.call('HDEL', KEYS[8], name)
      local v = moved()
      publish('close ' .. num(v) .. ' ' .. num(s[2]) .. ' ' .. name)
      return {0, s[2], 0, 0, 0}
    end
    if redis.call('GET', KEYS[6]) == ARGV[12] then
      redis.call('PEXPIRE', KEYS[6], ARGV[11])
      return {2, s[2], 0, s[4], 0}
    end
    local lease = redis.call('PTTL', KEYS[6])
    if lease < 0 then lease = 0 end
    return {3, s[2], lease, s[4], 0}
  elseif op == 'control' then
    -- An operator's control of the name across the fleet, kept in the
    -- shard's index under `!<name>` (no escaped name starts with `!`):
    -- `x <version> <kind> <until>`.
    local kind = ARGV[17]
    local field = '!' .. name
    if kind == 'open_for' then
      -- An opening like any other, without the quorum: every instance
      -- follows it, and one probes once it ends. It replaces a hold.
      if redis.call('HDEL', KEYS[8], field) == 1 then
        publish('ctl ' .. num(moved()) .. ' restore ' .. name)
      end
      return open(0)
    end
    local now = now_ms()
    local v = moved()
    if kind == 'restore' then
      redis.call('HDEL', KEYS[8], field)
    elseif kind == 'reset' then
      -- The fleet forgets the name; the mark stays for instances that
      -- read rather than hear it, then goes.
      redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], KEYS[7])
      redis.call('HDEL', KEYS[8], name)
      redis.call('HSET', KEYS[8], field, 'x ' .. num(v) .. ' reset ' .. num(now + tonumber(ARGV[6])))
    else
      -- Held until restored: an end far past any outage.
      redis.call('HSET', KEYS[8], field, 'x ' .. num(v) .. ' ' .. kind .. ' ' .. num(now + 3153600000000))
    end
    publish('ctl ' .. num(v) .. ' ' .. kind .. ' ' .. name)
    return {0, 0, 0, 0, 0}
  end
  return nil
end
local answer = run()
if not answer then return redis.error_reply('unknown operation') end
-- The shard's version now: the answer holds at it.
answer[6] = tonumber(redis.call('GET', KEYS[9]) or '0')
return answer
"#;

/// Reads one page of a shard's index: `{version, now, cursor, name,
/// entry, name, entry...}` with Redis's clock in milliseconds and the
/// cursor of the next page (`0`: this was the last), leaving out (and
/// deleting) entries whose time is up: a count forgotten, an opening the
/// fleet no longer keeps. `KEYS`: index, version. `ARGV`: cursor, page
/// size. A page is an `HSCAN` step, so that no exchange, however many
/// entries the shard holds, takes longer than a page's worth of work.
const READ_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local page = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
local out = {redis.call('GET', KEYS[2]) or '', string.format('%.0f', now), page[1]}
local flat = page[2]
local gone = {}
for i = 1, #flat, 2 do
  local until_ms = tonumber(string.match(flat[i + 1], ' (%d+)$') or '')
  if until_ms and until_ms > now then
    out[#out + 1] = flat[i]
    out[#out + 1] = flat[i + 1]
  else
    gone[#gone + 1] = flat[i]
  end
end
-- In pieces: Lua's stack takes a few thousand arguments at most.
for i = 1, #gone, 500 do
  redis.call('HDEL', KEYS[1], unpack(gone, i, math.min(i + 499, #gone)))
end
return out
"#;

/// Reads everything the fleet keeps of one name, for an operator: `{gen,
/// attempt, ok, record ttl, wait ttl, min_open ttl, failures, {failing
/// voters}, probe lock holder, its ttl, {voters whose vote runs}, control
/// entry}` (absent values empty, times to live as `PTTL` gives them).
/// `KEYS`: as the change script's. `ARGV`: escaped name.
const INSPECT_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rec = redis.call('HMGET', KEYS[1], 'gen', 'attempt', 'ok')
local failing = {}
for _, field in ipairs(redis.call('HKEYS', KEYS[4])) do
  if string.sub(field, 1, 2) == 'i:' then failing[#failing + 1] = string.sub(field, 3) end
end
return {
  rec[1] or '', rec[2] or '', rec[3] or '',
  redis.call('PTTL', KEYS[1]), redis.call('PTTL', KEYS[2]), redis.call('PTTL', KEYS[3]),
  redis.call('HGET', KEYS[4], 'n') or '0', failing,
  redis.call('GET', KEYS[6]) or '', redis.call('PTTL', KEYS[6]),
  redis.call('ZRANGEBYSCORE', KEYS[7], '(' .. string.format('%.0f', now), '+inf'),
  redis.call('HGET', KEYS[8], '!' .. ARGV[1]) or '',
}
"#;

/// Entries asked for per page of an index read (`HSCAN`'s `COUNT`, a
/// hint: a small hash comes whole). A page of a thousand entries is about
/// 50 KB and a millisecond of Redis's time.
pub(crate) const PAGE: usize = 1000;

/// The scripts, made once per store.
pub(crate) struct Scripts {
    pub(crate) change: Script,
    pub(crate) read: Script,
    pub(crate) inspect: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            change: Script::new(LUA),
            read: Script::new(READ_LUA),
            inspect: Script::new(INSPECT_LUA),
        }
    }
}

impl Op {
    /// The operation's name in the script.
    fn name(self) -> &'static str {
        match self {
            Op::Fail => "fail",
            Op::Reset => "reset",
            Op::Open => "open",
            Op::Probe => "probe",
            Op::ProbeOk => "probe_ok",
        }
    }
}

/// Where and how the scripts publish.
#[derive(Clone, Copy)]
pub(crate) struct Publish<'a> {
    /// The single server's channel; `None` on a Cluster, where each shard
    /// publishes on its own (sharded pub/sub).
    pub(crate) channel: Option<&'a str>,
}

/// One call of the change script (`EVALSHA`, loading it first when Redis
/// has forgotten it).
pub(crate) fn invocation<'a>(
    scripts: &'a Scripts,
    keys: &Keys,
    op: Op,
    names: (Publish<'_>, &str, &str, &str),
    args: &Args,
) -> ScriptInvocation<'a> {
    named_invocation(scripts, keys, op.name(), names, args)
}

/// One call of the change script's `control` operation, `kind` being
/// `open_for` (with `args.open_ms`), `open`, `closed`, `disabled`,
/// `restore` or `reset` (its mark kept `args.keep_ms`).
pub(crate) fn control_invocation<'a>(
    scripts: &'a Scripts,
    keys: &Keys,
    kind: &str,
    names: (Publish<'_>, &str, &str, &str),
    args: &Args,
) -> ScriptInvocation<'a> {
    let mut call = named_invocation(scripts, keys, "control", names, args);
    call.arg(kind);
    call
}

/// One read of everything the fleet keeps of one name.
pub(crate) fn inspect_invocation<'a>(
    scripts: &'a Scripts,
    keys: &Keys,
    escaped: &str,
) -> ScriptInvocation<'a> {
    let mut call = scripts.inspect.prepare_invoke();
    for key in keys.all() {
        call.key(key);
    }
    call.arg(escaped);
    call
}

fn named_invocation<'a>(
    scripts: &'a Scripts,
    keys: &Keys,
    op: &str,
    names: (Publish<'_>, &str, &str, &str),
    args: &Args,
) -> ScriptInvocation<'a> {
    let (publish, escaped, instance, voter) = names;
    let mut call = scripts.change.prepare_invoke();
    for key in keys.all() {
        call.key(key);
    }
    let (channel, sharded) = match publish.channel {
        Some(channel) => (channel, "0"),
        None => (keys.shard.channel.as_str(), "1"),
    };
    call.arg(op)
        .arg(channel)
        .arg(escaped)
        .arg(args.open_ms.max(1))
        .arg(args.min_open_ms)
        .arg(args.keep_ms.max(1))
        .arg(args.attempt)
        .arg(args.known_generation)
        .arg(args.threshold.max(1))
        .arg(args.window_ms.max(1))
        .arg(args.lease_ms.max(1))
        .arg(instance)
        .arg(args.successes.max(1))
        .arg(args.quorum.max(1))
        .arg(sharded)
        .arg(voter);
    call
}

/// One read of a page of `shard`'s index, from `cursor` (0: the first).
pub(crate) fn read_invocation<'a>(
    scripts: &'a Scripts,
    shard: &Shard,
    cursor: u64,
) -> ScriptInvocation<'a> {
    let mut call = scripts.read.prepare_invoke();
    call.key(&shard.index)
        .key(&shard.version)
        .arg(cursor)
        .arg(PAGE);
    call
}

/// The script's answer, checked: anything else is garbage, and a Redis
/// that answers garbage is treated as down.
impl Reply {
    /// The answer, and the shard's version it holds at.
    pub(crate) fn parse(value: &redis::Value) -> Option<(Reply, u64)> {
        let redis::Value::Array(items) = value else {
            return None;
        };
        let mut n = [0u64; 6];
        if items.len() != n.len() {
            return None;
        }
        for (slot, item) in n.iter_mut().zip(items) {
            match item {
                redis::Value::Int(i) if *i >= 0 => *slot = *i as u64,
                _ => return None,
            }
        }
        let [kind, generation, ms, attempt, failures, version] = n;
        let attempt = u32::try_from(attempt).ok()?;
        let reply = match kind {
            0 => Reply::Closed { failures },
            1 => Reply::Open {
                generation,
                left_ms: ms,
                attempt,
            },
            2 => Reply::ProbeWon {
                generation,
                attempt,
            },
            3 => Reply::ProbeHeld {
                generation,
                lease_ms: ms,
                attempt,
            },
            4 => Reply::Declined { failures },
            _ => return None,
        };
        Some((reply, version))
    }
}

/// The inspect script's answer as the fleet's state of the name; `None`
/// when it is not one.
pub(crate) fn parse_inspect(value: &redis::Value) -> Option<FleetState> {
    use redis::Value;
    let Value::Array(items) = value else {
        return None;
    };
    let [gen, attempt, ok, record_ttl, wait_ttl, min_open_ttl, failures, failing, holder, lease_ttl, votes, control] =
        items.as_slice()
    else {
        return None;
    };
    let text = |v: &Value| -> Option<String> {
        match v {
            Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        }
    };
    let number = |v: &Value| -> Option<u64> {
        match v {
            Value::Int(i) => u64::try_from(*i).ok(),
            v => text(v)?.parse().ok(),
        }
    };
    // A time to live: -2 (no key) and -1 (no expiry) read as none.
    let ttl = |v: &Value| -> Option<Duration> {
        match v {
            Value::Int(i) if *i >= 0 => Some(Duration::from_millis(*i as u64)),
            Value::Int(_) => None,
            _ => None,
        }
    };
    let names = |v: &Value| -> Option<Vec<String>> {
        match v {
            Value::Array(items) => items.iter().map(text).collect(),
            _ => None,
        }
    };
    let gen = text(gen)?;
    let opening = if gen.is_empty() {
        None
    } else {
        Some(FleetOpening {
            generation: gen.parse().ok()?,
            attempt: u32::try_from(number(attempt).unwrap_or(0)).ok()?,
            open_for: ttl(wait_ttl).unwrap_or_default(),
            kept_for: ttl(record_ttl).unwrap_or_default(),
            min_open_for: ttl(min_open_ttl).unwrap_or_default(),
            probe_successes: u32::try_from(number(ok).unwrap_or(0)).ok()?,
        })
    };
    let holder = text(holder)?;
    let prober = (!holder.is_empty()).then(|| (holder, ttl(lease_ttl).unwrap_or_default()));
    let control = match text(control)?.split(' ').nth(2) {
        Some(kind) => control_of(kind),
        None => None,
    };
    Some(FleetState {
        opening,
        failures: number(failures)?,
        failing: names(failing)?,
        votes: names(votes)?,
        prober,
        control,
    })
}

/// The control a kind in the index stands for, if it holds the breakers
/// (`reset` is a mark that passes).
pub(crate) fn control_of(kind: &str) -> Option<Control> {
    match kind {
        "open" => Some(Control::ForceOpen(None)),
        "closed" => Some(Control::ForceClosed),
        "disabled" => Some(Control::Disable),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    #[test]
    fn replies_of_the_wrong_shape_are_garbage() {
        let ints = |v: &[i64]| Value::Array(v.iter().map(|i| Value::Int(*i)).collect());
        assert_eq!(
            Reply::parse(&ints(&[1, 7, 300, 2, 0, 41])),
            Some((
                Reply::Open {
                    generation: 7,
                    left_ms: 300,
                    attempt: 2
                },
                41
            ))
        );
        assert_eq!(
            Reply::parse(&ints(&[4, 0, 0, 0, 3, 41])),
            Some((Reply::Declined { failures: 3 }, 41))
        );
        assert_eq!(Reply::parse(&ints(&[1, 7, 300, 2, 0])), None);
        assert_eq!(Reply::parse(&ints(&[9, 7, 300, 2, 0, 41])), None);
        assert_eq!(Reply::parse(&ints(&[1, -7, 300, 2, 0, 41])), None);
        assert_eq!(Reply::parse(&Value::Okay), None);
        assert_eq!(
            Reply::parse(&Value::Array(vec![Value::Nil; 6])),
            None,
            "nil is not a number"
        );
    }
}
