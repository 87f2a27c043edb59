-- A worker's pop (RmqWorker): one message, only while the worker holds
-- the slot's lease and nothing of the slot is in prepare (one delivery
-- at a time per slot: per key). ARGV: kind now deadline worker
-- -> {next due score | false, {id, key, body, retries}} or {false, {}}
if redis.call('GET', KEYS[9]) ~= ARGV[4] or redis.call('ZCARD', KEYS[2]) > 0 then return {false, {}} end
return take(ARGV[2], ARGV[3], 1)
