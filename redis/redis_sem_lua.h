/* redis_sem_lua.h - the semaphore's scripts, run atomically on the
 * server.  In a header of their own so that ferry-redis-bench's blocking
 * floor runs exactly the scripts the library runs.
 */
#ifndef FERRY_REDIS_SEM_LUA_H
#define FERRY_REDIS_SEM_LUA_H

/*
 * Acquire: KEYS holders, queue, alive, ticket, fence; ARGV token, limit,
 * lease (ms), waiter ttl (ms).  Drops expired holders and waiters, queues
 * the token if it is new, refreshes its heartbeat, and grants when the
 * token is among the first (limit - holders) in the queue: the token moves
 * to the holders with its lease, and the fence counter's next value is
 * returned.  0: still waiting.  The three sorted sets expire a while after
 * the last use (the counters never do: a fence must only grow).
 */
static const char acquire_lua[] __attribute__((unused)) =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local limit, lease, wttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
    "local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)\n"
    "for _, d in ipairs(dead) do\n"
    "  redis.call('ZREM', KEYS[2], d)\n"
    "  redis.call('ZREM', KEYS[3], d)\n"
    "end\n"
    "if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then\n"
    "  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), ARGV[1])\n"
    "end\n"
    "redis.call('ZADD', KEYS[3], now + wttl, ARGV[1])\n"
    "local keep = 2 * math.max(lease, wttl)\n"
    "local granted = 0\n"
    "local free = limit - redis.call('ZCARD', KEYS[1])\n"
    "if free > 0 and redis.call('ZRANK', KEYS[2], ARGV[1]) < free then\n"
    "  redis.call('ZREM', KEYS[2], ARGV[1])\n"
    "  redis.call('ZREM', KEYS[3], ARGV[1])\n"
    "  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])\n"
    "  granted = redis.call('INCR', KEYS[5])\n"
    "end\n"
    "for i = 1, 3 do\n"
    "  if redis.call('PTTL', KEYS[i]) < keep then redis.call('PEXPIRE', KEYS[i], keep) end\n"
    "end\n"
    "return granted\n";

/* Renew: KEYS holders; ARGV token, lease (ms).  1 if the token still held
 * its lease (now extended), 0 if it was gone. */
static const char renew_lua[] __attribute__((unused)) =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local exp = redis.call('ZSCORE', KEYS[1], ARGV[1])\n"
    "if not exp or tonumber(exp) <= now then\n"
    "  redis.call('ZREM', KEYS[1], ARGV[1])\n"
    "  return 0\n"
    "end\n"
    "local lease = tonumber(ARGV[2])\n"
    "redis.call('ZADD', KEYS[1], now + lease, ARGV[1])\n"
    "if redis.call('PTTL', KEYS[1]) < 2 * lease then redis.call('PEXPIRE', KEYS[1], 2 * lease) end\n"
    "return 1\n";

/* Release: KEYS holders, queue, alive; ARGV token.  Removes the token
 * everywhere (a permit, or a waiter that gave up); 1 if it held a
 * permit. */
static const char release_lua[] __attribute__((unused)) =
    "redis.call('ZREM', KEYS[2], ARGV[1])\n"
    "redis.call('ZREM', KEYS[3], ARGV[1])\n"
    "return redis.call('ZREM', KEYS[1], ARGV[1])\n";

#endif /* FERRY_REDIS_SEM_LUA_H */
