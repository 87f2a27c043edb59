-- One bounded step of the committed bulk call: pops up to `count` changes
-- of BULK and makes each as delete.lua or reschedule.lua makes one (a
-- message gone, ended, or consuming for a reschedule, is left as it is).
-- No other script of the topic runs until BULK is empty (the fence in
-- common.lua), so clients see the call whole. Changes: "D<retire_at> <id>"
-- (-> DELETED 7), "R<now> <trigger> <expire> <rk>" (a new trigger time;
-- the id ends rk) and "E<retire_at> <id>" (a resume's expire: a WAITING or
-- READY message -> EXPIRED 5, end reason `paused`). ARGV: count call ('': whichever call is being applied)
-- -> {deleted, moved, expired, done (1: `call` is applied whole, or no call is
-- being applied), earliest new waiting trigger or false, 1 if a parked
-- message became pullable (woke), trigger times made ready...}
local count, call = tonumber(ARGV[1]), ARGV[2]
local current = redis.call('HGET', BULKINFO, 'call') or ''
if redis.call('EXISTS', BULK) == 0 or (call ~= '' and current ~= call) then return {0, 0, 0, 1, false, 0} end
local items = redis.call('LPOP', BULK, count) or {}
local deleted, moved, expired, next_waiting, made_ready = 0, 0, 0, false, {}
for _, item in ipairs(items) do
  if string.sub(item, 1, 1) == 'E' then  -- a resume's expire: WAITING or READY -> EXPIRED, end reason `paused`
    local retire_at, id = string.match(item, '^E(%d+) (.*)$')
    local m = load(id)
    if m and (m.status == '1' or m.status == '2') then
      if m.status == '1' then redis.call('ZREM', WAITING, id) else ready_remove(id, m) end
      finish(id, m, '5', retire_at)
      m.endReason = 'paused'
      save(id, m)
      expired = expired + 1
    end
  elseif string.sub(item, 1, 1) == 'D' then
    local retire_at, id = string.match(item, '^D(%d+) (.*)$')
    local m = load(id)
    if m then
      local st = m.status
      if st == '1' or st == '2' or st == '3' then
        if st == '1' then redis.call('ZREM', WAITING, id)
        elseif st == '2' then ready_remove(id, m)
        else consuming_end(id, m) end
        finish(id, m, '7', retire_at)
        save(id, m)
        deleted = deleted + 1
      end
    end
  else
    local now, trigger, expire, rk = string.match(item, '^R(%d+) (%d+) (%d+) (.*)$')
    local id = string.sub(rk, 22)
    local m = load(id)
    if m and (m.status == '1' or m.status == '2') then
      if m.status == '1' then redis.call('ZREM', WAITING, id) else ready_remove(id, m) end
      m.trigger, m.expire, m.rk = trigger, expire, rk
      if tonumber(trigger) > tonumber(now) then
        redis.call('ZADD', WAITING, trigger, id)
        m.status = '1'
        if not next_waiting or tonumber(trigger) < tonumber(next_waiting) then next_waiting = trigger end
      else
        ready_add(id, m)
        made_ready[#made_ready + 1] = trigger
      end
      save(id, m)
      moved = moved + 1
    end
  end
end
if current ~= '' then redis.call('HINCRBY', BULKINFO, 'n:' .. current, deleted + moved + expired) end
local done = 0
if redis.call('EXISTS', BULK) == 0 then
  redis.call('HDEL', BULKINFO, 'call')
  done = 1
end
redis.call('PEXPIRE', BULKINFO, 3600000)
local out = {deleted, moved, expired, done, next_waiting, woken and 1 or 0}
for _, t in ipairs(made_ready) do out[#out + 1] = t end
return out
