-- rescheduleMsgs: each listed WAITING or READY message gets a new trigger
-- time, as reschedule.lua does one; all in one script, so the call is
-- whole. ARGV: now, then per message: id trigger expire rk -> {moved,
-- made ready} (an id gone, consuming or ended meanwhile is left as it is)
local now, moved, ready = tonumber(ARGV[1]), 0, 0
for i = 2, #ARGV, 4 do
  local id = ARGV[i]
  local m = load(id)
  if m and (m.status == '1' or m.status == '2') then
    if m.status == '1' then redis.call('ZREM', WAITING, id) else ready_remove(id, m) end
    m.trigger, m.expire, m.rk = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
    if tonumber(m.trigger) > now then
      redis.call('ZADD', WAITING, m.trigger, id)
      m.status = '1'
    else
      ready_add(id, m)
      ready = ready + 1
    end
    save(id, m)
    moved = moved + 1
  end
end
return {moved, ready}
