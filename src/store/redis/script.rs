//! The one Lua script that reads and changes a breaker's shared state.
//!
//! Every decision that more than one instance could take at once is taken
//! inside Redis, atomically: counting a failure and opening at the
//! threshold, writing an opening, taking the probe lock, counting a probe's
//! success and closing. Times are Redis's own (key expiries), never an
//! instance's clock, so clock skew between instances cannot shorten or
//! stretch an open period.
//!
//! Every operation answers with five integers, `{kind, generation, ms,
//! attempt, failures}`:
//!
//! | kind | meaning | `ms` |
//! | --- | --- | --- |
//! | 0 | closed | 0 |
//! | 1 | open (or half-open when `ms` is 0, and nobody holds the probe lock for the caller) | what is left of the open period |
//! | 2 | half-open, and the caller holds the probe lock | 0 |
//! | 3 | half-open, another instance holds the probe lock | what is left of its lease |

use redis::{Script, ScriptInvocation};

use super::keys::Keys;
use crate::store::fleet::{Args, Op, Reply};

const LUA: &str = r#"
local op = ARGV[1]
local function state()
  local rec = redis.call('HMGET', KEYS[1], 'gen', 'attempt')
  if not rec[1] then
    return {0, 0, 0, 0, tonumber(redis.call('GET', KEYS[4]) or '0')}
  end
  local wait = redis.call('PTTL', KEYS[2])
  if wait < 0 then wait = 0 end
  return {1, tonumber(rec[1]), wait, tonumber(rec[2]), 0}
end
local function open(attempt)
  -- Generations never repeat: a lost counter starts again from Redis's
  -- clock in milliseconds, above any number it handed out before.
  if redis.call('EXISTS', KEYS[5]) == 0 then
    local t = redis.call('TIME')
    redis.call('SET', KEYS[5], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
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
  redis.call('DEL', KEYS[4], KEYS[6])
  redis.call('PUBLISH', ARGV[2], 'open ' .. g .. ' ' .. ARGV[4] .. ' ' .. attempt .. ' ' .. ARGV[3])
  return {1, g, tonumber(ARGV[4]), attempt, 0}
end
if op == 'state' then
  return state()
elseif op == 'fail' then
  if redis.call('EXISTS', KEYS[1]) == 1 then return state() end
  local n = redis.call('INCR', KEYS[4])
  redis.call('PEXPIRE', KEYS[4], ARGV[10])
  if n < tonumber(ARGV[9]) then return {0, 0, 0, 0, n} end
  return open(0)
elseif op == 'reset' then
  if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('DEL', KEYS[4]) end
  return state()
elseif op == 'open' then
  local g = redis.call('HGET', KEYS[1], 'gen')
  if g and (g ~= ARGV[8] or redis.call('EXISTS', KEYS[2]) == 1) then return state() end
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
    redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6])
    redis.call('PUBLISH', ARGV[2], 'close ' .. s[2] .. ' ' .. ARGV[3])
    return {0, s[2], 0, 0, 0}
  end
  if redis.call('GET', KEYS[6]) == ARGV[12] then
    redis.call('PEXPIRE', KEYS[6], ARGV[11])
    return {2, s[2], 0, s[4], 0}
  end
  local lease = redis.call('PTTL', KEYS[6])
  if lease < 0 then lease = 0 end
  return {3, s[2], lease, s[4], 0}
end
return redis.error_reply('unknown operation')
"#;

/// The script, made once per store.
pub(crate) fn script() -> Script {
    Script::new(LUA)
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

/// One call of the script (`EVALSHA`, loading it first when Redis has
/// forgotten it).
pub(crate) fn invocation<'a>(
    script: &'a Script,
    keys: &Keys,
    op: Op,
    names: (&str, &str, &str),
    args: &Args,
) -> ScriptInvocation<'a> {
    let (channel, escaped, instance) = names;
    let mut call = script.prepare_invoke();
    for key in keys.all() {
        call.key(key);
    }
    call.arg(op.name())
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
        .arg(args.successes.max(1));
    call
}

/// The script's answer, checked: anything else is garbage, and a Redis
/// that answers garbage is treated as down.
impl Reply {
    pub(crate) fn parse(value: &redis::Value) -> Option<Reply> {
        let redis::Value::Array(items) = value else {
            return None;
        };
        let mut n = [0u64; 5];
        if items.len() != n.len() {
            return None;
        }
        for (slot, item) in n.iter_mut().zip(items) {
            match item {
                redis::Value::Int(i) if *i >= 0 => *slot = *i as u64,
                _ => return None,
            }
        }
        let [kind, generation, ms, attempt, failures] = n;
        let attempt = u32::try_from(attempt).ok()?;
        Some(match kind {
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
            _ => return None,
        })
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
            Reply::parse(&ints(&[1, 7, 300, 2, 0])),
            Some(Reply::Open {
                generation: 7,
                left_ms: 300,
                attempt: 2
            })
        );
        assert_eq!(Reply::parse(&ints(&[1, 7, 300, 2])), None);
        assert_eq!(Reply::parse(&ints(&[9, 7, 300, 2, 0])), None);
        assert_eq!(Reply::parse(&ints(&[1, -7, 300, 2, 0])), None);
        assert_eq!(Reply::parse(&Value::Okay), None);
        assert_eq!(
            Reply::parse(&Value::Array(vec![Value::Nil; 5])),
            None,
            "nil is not a number"
        );
    }
}
