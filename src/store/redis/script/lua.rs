//! The scripts' source, in Lua: the change script (every operation on
//! one breaker's keys and its shard's index, and an operator's control),
//! the read of a page of a shard's index, and the read of everything the
//! fleet keeps of one name. Each script's comment gives its `KEYS` and
//! `ARGV`; the change script answers as the module's table says.

/// `KEYS`: record, wait, min_open, failures, generation, probe_lock, votes,
/// index, version. `ARGV`: op, channel, escaped name, open_ms,
/// min_open_ms, keep_ms, attempt, known generation, threshold, window_ms,
/// lease_ms, instance (the probe lock's holder), successes, quorum,
/// sharded publish (`1`), voter (whose failures count toward the quorum),
/// and for `control` the control's kind.
pub(super) const LUA: &str = r#"
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
    -- for its open period and the probe lock.
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
pub(super) const READ_LUA: &str = r#"
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
pub(super) const INSPECT_LUA: &str = r#"
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
