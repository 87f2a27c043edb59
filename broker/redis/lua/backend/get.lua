-- ARGV: id -> {meta, body} or nil
local raw = redis.call('HGET', META, ARGV[1])
if not raw then return nil end
return {raw, redis.call('HGET', BODY, ARGV[1])}
