-- ARGV: now retire_at dedup_from, then per message: id msg produce trigger ttl expire
-- maxRetry priority tag rk strict key traceparent tracestate skip fairKey retry dead
-- ('': none; the meta holds the last five only when given; `retry`, the deliveries it
-- had, '0' but for an import's, and `dead`, '5' or '6' for an import's dead message, which
-- is stored ended so). -> per message {'1'|'2'|'5'|'6'}
-- (stored: waiting, ready, expired, ended) or {'0', meta, body} (the id exists: the stored
-- message). An id whose message has ended (4-7) is stored anew unless
-- `strict` is '1' (camellia stores the new one), or it ended within the
-- topic's dedupWindowMillis: its purge time in RETIRE is at or after
-- `dedup_from` (now - window + retention; '': no window); each send it
-- answers so moves its purge time to `retire_at`: the window slides. `skip` (a schedule's run
-- with misfire=skip: nominal + grace): released first after it, the message
-- ends unseen (5), here if due already, else in tick.lua; 'r': a schedule's run
-- of another misfire; either marks a run (m.run), held back while its topic or
-- key is paused (common.lua's hold).
if fenced() then return redis.error_reply(FENCE) end
local now, retire_at, dedup_from = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local function deduplicated(id)
  if not dedup_from then return false end
  local purge_at = redis.call('ZSCORE', RETIRE, id)
  return purge_at ~= false and purge_at ~= nil and tonumber(purge_at) >= dedup_from
end
local out = {}
-- A topic holding no message from here on has every tagged message in TAGS:
-- the member '' says so (topics from before TAGS are scanned until then).
if redis.call('HLEN', META) == 0 then redis.call('ZADD', TAGS, 0, '') end
for i = 4, #ARGV, 18 do
  local id = ARGV[i]
  local raw = redis.call('HGET', META, id)
  if raw and ARGV[i + 10] ~= '1' and tonumber(cjson.decode(raw).status) >= 4 then
    if deduplicated(id) then
      redis.call('ZADD', RETIRE, retire_at, id)  -- answered: the window slides (and it is kept that much longer)
    else
      purge(id)
      raw = nil
    end
  end
  if raw then
    out[#out + 1] = {'0', raw, redis.call('HGET', BODY, id)}
  else
    local m = {produce = ARGV[i + 2], trigger = ARGV[i + 3], ttl = ARGV[i + 4], expire = ARGV[i + 5],
               maxRetry = ARGV[i + 6], priority = ARGV[i + 7], tag = ARGV[i + 8], rk = ARGV[i + 9],
               retry = ARGV[i + 16], status = '1'}
    if ARGV[i + 11] ~= '' then m.key = ARGV[i + 11] end
    if ARGV[i + 12] ~= '' then
      m.traceparent = ARGV[i + 12]
      if ARGV[i + 13] ~= '' then m.tracestate = ARGV[i + 13] end
    end
    if ARGV[i + 14] ~= '' then m.run = '1' end
    if ARGV[i + 14] ~= '' and ARGV[i + 14] ~= 'r' then m.skip = ARGV[i + 14] end
    if ARGV[i + 15] ~= '' then m.fairKey = ARGV[i + 15] end
    if ARGV[i + 17] ~= '' then
      finish(id, m, ARGV[i + 17], retire_at)
    elseif tonumber(m.trigger) > now then
      redis.call('ZADD', WAITING, m.trigger, id)
    elseif now < tonumber(m.expire) and run_paused(m) then
      hold(id, m)
    elseif now >= tonumber(m.expire) or skipped(m, now) then
      finish(id, m, '5', retire_at)
    else
      ready_add(id, m)
    end
    save(id, m)
    tag_add(id, m)
    redis.call('HSET', BODY, id, ARGV[i + 1])
    out[#out + 1] = {m.status}
  end
end
return out
