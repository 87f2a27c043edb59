-- ARGV: id release(1|0) retire_at -> 'NF' | 'OK' | 'NOOP' (ended: nothing to
-- delete; released all the same when asked); 'OK+' when a parked message
-- became pullable (woke: a consuming message's key freed)
if fenced() then return redis.error_reply(FENCE) end
local id = ARGV[1]
local m = load(id)
if not m then return 'NF' end
local st = m.status
if st == '1' then redis.call('ZREM', WAITING, id)
elseif st == '2' then ready_remove(id, m)
elseif st == '3' then consuming_end(id, m) end
if ARGV[2] == '1' then
  purge(id)
  if st ~= '1' and st ~= '2' and st ~= '3' then return 'NOOP' end
  return woke('OK')
end
if st ~= '1' and st ~= '2' and st ~= '3' then return 'NOOP' end
finish(id, m, '7', ARGV[3])
save(id, m)
return woke('OK')
