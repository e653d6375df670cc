/* redis_sem_lua.h - the semaphore's scripts, run atomically on the
 * server.  In a header of their own so that ferry-redis-bench's blocking
 * floor runs exactly the scripts the library runs.
 *
 * KEYS of the acquire and release scripts: holders, queue, alive, ticket,
 * fence, fences (docs/redis.md has the table).  A string here is a run of
 * literals, or FERRY_SEM_LUA_COMMON followed by literals: the bench's
 * asyncio program reads them from this file and knows no other form.
 */
#ifndef FERRY_REDIS_SEM_LUA_H
#define FERRY_REDIS_SEM_LUA_H

/*
 * What the acquire and release scripts begin with: the server's time, then
 * holders whose lease has run out and waiters whose heartbeat has are
 * dropped, then grant_heads(), which hands every free permit to the first
 * waiters of the queue.  A waiter granted here by another's script holds
 * it until its own heartbeat runs out (so a dead waiter gives it back as
 * soon as it would have been dropped), and is told on its wake channel,
 * "ferry-wake:ID" for a token "wID:N", with the message "FENCE TOKEN"; a
 * token without that form (a waiter that only polls) is told nothing and
 * learns it at its next poll.  `self` is the caller's own token, granted
 * with the lease `lease`; its answer tells it.  The PUBLISH is a pcall: a
 * server that refuses it (an ACL without the channel) leaves the waiter to
 * its next poll rather than failing the script.
 */
#define FERRY_SEM_LUA_COMMON \
    "local t = redis.call('TIME')\n" \
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n" \
    "for _, h in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do\n" \
    "  redis.call('ZREM', KEYS[1], h)\n" \
    "  redis.call('HDEL', KEYS[6], h)\n" \
    "end\n" \
    "for _, d in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do\n" \
    "  redis.call('ZREM', KEYS[2], d)\n" \
    "  redis.call('ZREM', KEYS[3], d)\n" \
    "end\n" \
    "local function grant_heads(limit, self, lease)\n" \
    "  local free = limit - redis.call('ZCARD', KEYS[1])\n" \
    "  if free <= 0 then return end\n" \
    "  for _, w in ipairs(redis.call('ZRANGE', KEYS[2], 0, free - 1)) do\n" \
    "    local alive = tonumber(redis.call('ZSCORE', KEYS[3], w)) or now\n" \
    "    redis.call('ZREM', KEYS[2], w)\n" \
    "    redis.call('ZREM', KEYS[3], w)\n" \
    "    local f = redis.call('INCR', KEYS[5])\n" \
    "    redis.call('HSET', KEYS[6], w, f)\n" \
    "    if w == self then\n" \
    "      redis.call('ZADD', KEYS[1], now + lease, w)\n" \
    "    else\n" \
    "      redis.call('ZADD', KEYS[1], alive, w)\n" \
    "      local id = string.match(w, '^w([^:]+):')\n" \
    "      if id then\n" \
    "        redis.pcall('PUBLISH', 'ferry-wake:' .. id, string.format('%d %s', f, w))\n" \
    "      end\n" \
    "    end\n" \
    "  end\n" \
    "end\n"

/*
 * Acquire: ARGV token, limit, lease (ms), waiter ttl (ms).  A token found
 * among the holders was granted by another's script (its wake lost or
 * still on its way): its lease becomes a full one.  Otherwise the token is
 * queued if it is new, its heartbeat refreshed, and the free permits
 * handed out in queue order.  Returns the token's fence if it holds a
 * permit, else 0 (still waiting).  The sorted sets and the hash of fences
 * expire a while after the last use (the counters never do: a fence must
 * only grow).
 */
static const char acquire_lua[] __attribute__((unused)) = FERRY_SEM_LUA_COMMON
    "local tok = ARGV[1]\n"
    "local limit, lease, wttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])\n"
    "if redis.call('ZSCORE', KEYS[1], tok) then\n"
    "  redis.call('ZADD', KEYS[1], now + lease, tok)\n"
    "else\n"
    "  if not redis.call('ZSCORE', KEYS[2], tok) then\n"
    "    redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), tok)\n"
    "  end\n"
    "  redis.call('ZADD', KEYS[3], now + wttl, tok)\n"
    "  grant_heads(limit, tok, lease)\n"
    "end\n"
    "local keep = 2 * math.max(lease, wttl)\n"
    "for _, i in ipairs({1, 2, 3, 6}) do\n"
    "  if redis.call('PTTL', KEYS[i]) < keep then redis.call('PEXPIRE', KEYS[i], keep) end\n"
    "end\n"
    "return tonumber(redis.call('HGET', KEYS[6], tok) or '0')\n";

/* Renew: KEYS holders, fences; ARGV token, lease (ms).  1 if the token
 * still held its lease (now extended), 0 if it was gone. */
static const char renew_lua[] __attribute__((unused)) =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local exp = redis.call('ZSCORE', KEYS[1], ARGV[1])\n"
    "if not exp or tonumber(exp) <= now then\n"
    "  redis.call('ZREM', KEYS[1], ARGV[1])\n"
    "  redis.call('HDEL', KEYS[2], ARGV[1])\n"
    "  return 0\n"
    "end\n"
    "local lease = tonumber(ARGV[2])\n"
    "redis.call('ZADD', KEYS[1], now + lease, ARGV[1])\n"
    "for i = 1, 2 do\n"
    "  if redis.call('PTTL', KEYS[i]) < 2 * lease then redis.call('PEXPIRE', KEYS[i], 2 * lease) end\n"
    "end\n"
    "return 1\n";

/* Release: ARGV token, limit.  Removes the token everywhere (a permit, or
 * a waiter that gave up) and hands the permits now free to the first
 * waiters; 1 if the token held a permit. */
static const char release_lua[] __attribute__((unused)) =
    FERRY_SEM_LUA_COMMON "redis.call('ZREM', KEYS[2], ARGV[1])\n"
                         "redis.call('ZREM', KEYS[3], ARGV[1])\n"
                         "redis.call('HDEL', KEYS[6], ARGV[1])\n"
                         "local held = redis.call('ZREM', KEYS[1], ARGV[1])\n"
                         "grant_heads(tonumber(ARGV[2]), nil, 0)\n"
                         "return held\n";

#endif /* FERRY_REDIS_SEM_LUA_H */
