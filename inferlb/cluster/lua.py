"""The Lua scripts the replicas run on Redis: each is one atomic step on the server's clock.

Every script reads the time with ``redis.call('TIME')`` (plus ``offset_ms``, 0 in production; a
test moves the shared clock with it instead of sleeping), so leases and timers never depend on a
replica's own clock: clock skew between replicas does not matter. Times are epoch milliseconds.

:data:`SYNC_LUA` — one round trip per sync of one replica:

* heartbeat: ``replicas`` hash, field = replica id, value ``expires_ms|info`` (info = config hash
  and address); expired entries are deleted; the live ones are returned (count, and id/info).
* slot shares, per resource (a model pool, or a key's ``max_parallel``): hash field = replica id,
  value ``grant|inuse|demand|expires_ms``. Expired entries (a replica that died, SIGKILL included)
  are deleted first, so their slots return after at most one lease. Targets are max-min fair:
  the limit is water-filled over the live replicas' demands, what is left is split evenly
  (remainders in replica-id order), so an idle replica keeps a few slots and admits at once. The
  caller's grant is ``min(target, limit − Σ other grants)``, raised to what it has in use (a
  grant is never below what is in flight, so the recorded grants always cover the real load),
  never negative. Hence Σ grants ≤ limit whenever any replica is granted new room. The recorded
  grants cover the real load only if a replica holds no more than its recorded grant at any time,
  which it keeps by taking no more than the ``inuse`` it sent until it has read the answer
  (:mod:`.shares`).
* retry budget, per pool: the caller's request count and retry correction are added to the
  current time bucket (``width_ms``; buckets older than ``slots`` are deleted); then the caller
  *claims* what it wants of what the window leaves (``max(min_retries, ratio × requests) −
  retries``), counted as retries at once, so the claims of all replicas together never pass the
  budget; the unspent rest of a claim is given back at the caller's next sync (a negative
  correction). Returns the window's totals and the claim.
* the health version (a counter bumped by :data:`HEALTH_LUA`), so a replica re-reads the shared
  node states only when they changed.

:data:`HEALTH_LUA` — one node's shared state after a local transition: ``ejected`` (outlier or
hardware), ``cooldown`` (a 429's Retry-After) or ``clear`` (an ejection ended early). An ejection
while the node is already out is not a second ejection (the timer and count are one state); the
ejection time is Envoy's ``base × ejections in a row`` with the multiplier decayed by one per
``interval_ms`` the node stayed in since its last ejection ended. It bumps the version and
publishes the record on the cluster channel.
"""

from __future__ import annotations

__all__ = ["HEALTH_LUA", "SYNC_LUA"]

SYNC_LUA = r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
local me = ARGV[1]
local lease = tonumber(ARGV[2])
local n = tonumber(ARGV[5])
local m = tonumber(ARGV[6])
local width = tonumber(ARGV[7])
local slots = tonumber(ARGV[8])
local exp = now + lease
local function fmt(x) return string.format('%.0f', x) end

redis.call('HSET', KEYS[1], me, fmt(exp) .. '|' .. ARGV[4])
redis.call('PEXPIRE', KEYS[1], lease * 4)
local reps = redis.call('HGETALL', KEYS[1])
local live = {}
for i = 1, #reps, 2 do
  local v = reps[i + 1]
  local sep = string.find(v, '|', 1, true)
  local e = tonumber(string.sub(v, 1, sep - 1))
  if e <= now then
    redis.call('HDEL', KEYS[1], reps[i])
  else
    live[#live + 1] = reps[i]
    live[#live + 1] = string.sub(v, sep + 1)
  end
end
local out = {fmt(now), #live / 2, live, redis.call('GET', KEYS[2]) or '0'}

local function fill(ids, want, total, alloc)
  local left = total
  local open = {}
  for _, id in ipairs(ids) do
    if want[id] > alloc[id] then open[#open + 1] = id end
  end
  while left > 0 and #open > 0 do
    local share = math.floor(left / #open)
    if share == 0 then
      for k = 1, left do alloc[open[k]] = alloc[open[k]] + 1 end
      return 0
    end
    local still = {}
    for _, id in ipairs(open) do
      local give = math.min(share, want[id] - alloc[id])
      alloc[id] = alloc[id] + give
      left = left - give
      if alloc[id] < want[id] then still[#still + 1] = id end
    end
    open = still
  end
  return left
end

for i = 1, n do
  local a = 10 + (i - 1) * 3
  local limit = math.floor(tonumber(ARGV[a + 1]))
  local inuse = tonumber(ARGV[a + 2])
  local demand = tonumber(ARGV[a + 3])
  local key = KEYS[2 + i]
  local h = redis.call('HGETALL', key)
  local ids = {me}
  local want = {}
  local alloc = {}
  want[me] = demand
  alloc[me] = 0
  local others = 0
  for j = 1, #h, 2 do
    local id = h[j]
    if id ~= me then
      local g, u, d, e = string.match(h[j + 1], '^([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
      if e == nil or tonumber(e) <= now then
        redis.call('HDEL', key, id)
      else
        ids[#ids + 1] = id
        want[id] = tonumber(d)
        alloc[id] = 0
        others = others + tonumber(g)
      end
    end
  end
  table.sort(ids)
  local left = fill(ids, want, limit, alloc)
  if left > 0 then
    local all = {}
    for _, id in ipairs(ids) do all[id] = 1e15 end
    fill(ids, all, left, alloc)
  end
  local target = alloc[me]
  local grant = math.min(target, limit - others)
  if grant < inuse then grant = inuse end
  if grant < 0 then grant = 0 end
  redis.call('HSET', key, me, fmt(grant) .. '|' .. fmt(inuse) .. '|' .. fmt(demand) .. '|' .. fmt(exp))
  redis.call('PEXPIRE', key, lease * 4)
  out[#out + 1] = grant
  out[#out + 1] = target
end

local bucket = math.floor(now / width)
local ratio = tonumber(ARGV[9])
local floor_min = tonumber(ARGV[10])
for k = 1, m do
  local a = 10 + n * 3 + (k - 1) * 3
  local key = KEYS[2 + n + k]
  local dq = tonumber(ARGV[a + 1])
  local dr = tonumber(ARGV[a + 2])
  local want = tonumber(ARGV[a + 3])
  if dq ~= 0 then redis.call('HINCRBY', key, fmt(bucket) .. 'q', dq) end
  if dr ~= 0 then redis.call('HINCRBY', key, fmt(bucket) .. 'r', dr) end
  local h = redis.call('HGETALL', key)
  local q, r = 0, 0
  for j = 1, #h, 2 do
    local f = h[j]
    local b = tonumber(string.sub(f, 1, -2))
    if b == nil or b <= bucket - slots then
      redis.call('HDEL', key, f)
    elseif string.sub(f, -1) == 'q' then
      q = q + tonumber(h[j + 1])
    else
      r = r + tonumber(h[j + 1])
    end
  end
  local left = math.floor(math.max(floor_min, ratio * q) - r)
  local part = 0
  if left >= 1 then part = math.min(left, want) end
  if part > 0 then
    redis.call('HINCRBY', key, fmt(bucket) .. 'r', part)
    r = r + part
  end
  redis.call('PEXPIRE', key, width * (slots + 1) * 2)
  out[#out + 1] = q
  out[#out + 1] = r
  out[#out + 1] = part
end
return out
"""

# KEYS[1] health hash, KEYS[2] health version.
# ARGV: node, kind (ejected|cooldown|clear), length_ms, hardware (0/1), base_ms, max_ms, interval_ms,
#       origin replica, reason, channel, offset_ms, evidence (JSON text).
HEALTH_LUA = r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[11])
local node = ARGV[1]
local kind = ARGV[2]
local len = tonumber(ARGV[3])
local hw = ARGV[4] == '1'
local cur = redis.call('HGET', KEYS[1], node)
local rec
if cur then
  rec = cjson.decode(cur)
else
  rec = {backoff = 0, ejections = 0, ejected_until = 0, cooldown_until = 0, hardware = false}
end
local changed = true
if kind == 'ejected' then
  local out_now = rec.ejected_until > now
  if hw then
    if not (out_now and rec.hardware) then rec.ejections = rec.ejections + 1 end
    local base = 0
    if out_now then base = rec.ejected_until end
    rec.ejected_until = math.max(base, now + len)
    rec.hardware = true
  elseif not out_now then
    local b = rec.backoff
    if rec.ejected_until > 0 then
      b = math.max(0, b - math.floor((now - rec.ejected_until) / tonumber(ARGV[7])))
    end
    b = b + 1
    local base_ms = tonumber(ARGV[5])
    rec.backoff = b
    rec.ejections = rec.ejections + 1
    rec.ejected_until = now + math.min(math.max(tonumber(ARGV[6]), base_ms), base_ms * b)
    rec.hardware = false
  else
    changed = false
  end
  if changed then
    rec.cleared = false
    rec.reason = ARGV[9]
    rec.origin = ARGV[8]
    rec.evidence = ARGV[12]
  end
elseif kind == 'cooldown' then
  if now + len > rec.cooldown_until then
    rec.cooldown_until = now + len
    rec.cooldown_reason = ARGV[9]
    rec.cooldown_origin = ARGV[8]
  else
    changed = false
  end
elseif kind == 'clear' then
  if rec.ejected_until > now then
    rec.ejected_until = now
    rec.cleared = true
  else
    changed = false
  end
end
local enc = cjson.encode(rec)
if changed then
  redis.call('HSET', KEYS[1], node, enc)
  redis.call('INCR', KEYS[2])
  redis.call('PUBLISH', ARGV[10], cjson.encode({t = 'health', node = node, rec = rec,
                                               now = string.format('%.0f', now), from = ARGV[8]}))
end
return {enc, string.format('%.0f', now)}
"""
