-- listDeadMsg: the topic's final messages in purge order (RETIRE: score =
-- when purged, i.e. when ended + retention; ties by id), those in the
-- wanted statuses. Starts after the cursor member (found by its rank while it
-- is there, else by its score), reads at most max_scan members.
-- ARGV: cursor_score cursor_id limit max_scan statuses (e.g. ',5,6,')
-- -> {next score or false, next id or false, id, meta, body, id, meta, ...}
if fenced() then return redis.error_reply(FENCE) end
local cscore, cid, limit, max_scan, wanted = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local members
local rank = cid ~= '' and redis.call('ZRANK', RETIRE, cid)
if rank and redis.call('ZSCORE', RETIRE, cid) ~= cscore then rank = false end
if rank then
  members = redis.call('ZRANGE', RETIRE, rank + 1, rank + max_scan, 'WITHSCORES')
else
  local low = cscore == '' and '-inf' or cscore
  members = redis.call('ZRANGEBYSCORE', RETIRE, low, '+inf', 'WITHSCORES', 'LIMIT', 0, max_scan)
end
local out = {false, false}
local found, last = 0, 0
for i = 1, #members, 2 do
  local id, score = members[i], members[i + 1]
  if cid == '' or rank or score ~= cscore or less(cid, id) then
    local m = load(id)
    if m and string.find(wanted, ',' .. m.status .. ',', 1, true) then
      out[#out + 1] = id
      out[#out + 1] = redis.call('HGET', META, id)
      out[#out + 1] = redis.call('HGET', BODY, id)
      found = found + 1
    end
  end
  last = i
  if found >= limit then break end
end
if last > 0 and (found >= limit or #members >= 2 * max_scan) then
  out[1], out[2] = members[last + 1], members[last]
end
return out
