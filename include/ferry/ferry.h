/* ferry/ferry.h - everything: tasks on a libevent loop, the primitives they
 * share, and the bridge to threads.
 *
 *   ferry/loop.h    the loop: run, stop, call_soon, call_later, time
 *   ferry/task.h    tasks, cancellation, deadline scopes, task groups
 *   ferry/sync.h    lock, semaphore, event, condition
 *   ferry/queue.h   FIFO, LIFO and priority queues with backpressure
 *   ferry/flight.h  singleflight and per-key locks
 *   ferry/bridge.h  call_soon_threadsafe, thread pools, to_thread,
 *                   calling into a loop from threads, the mixed channel
 *   ferry/signal.h  signal subscriptions: deliveries counted, never lost,
 *                   received by tasks
 *   ferry/stream.h  buffered streams over sockets and pipes; TCP and Unix
 *                   sockets: listen, accept, connect
 *   ferry/resolve.h name resolution for tasks (getaddrinfo)
 *   ferry/select.h  wait on several cases (fd, stream, event, queue, task
 *                   end, future, signal, time) and perform exactly one
 *   ferry/runtime.h a runtime of N loops on N threads, the call from a
 *                   task on one loop to another, futures across loops
 *   ferry/tls.h     TLS over a stream (OpenSSL), when FERRY_HAVE_TLS
 *                   (ferry/features.h) says this build has it
 *
 * Not included here, as it is a library of its own (ferry_redis):
 *   ferry/redis.h   Redis for tasks (hiredis): a connection, a semaphore
 *                   and lock across processes, when FERRY_HAVE_REDIS
 */
#ifndef FERRY_FERRY_H
#define FERRY_FERRY_H

#include "ferry/loop.h"
#include "ferry/task.h"
#include "ferry/sync.h"
#include "ferry/queue.h"
#include "ferry/flight.h"
#include "ferry/bridge.h"
#include "ferry/job.h"
#include "ferry/signal.h"
#include "ferry/stream.h"
#include "ferry/resolve.h"
#include "ferry/select.h"
#include "ferry/sim.h"
#include "ferry/watch.h"
#include "ferry/runtime.h"
#include "ferry/features.h"
#if FERRY_HAVE_TLS
#include "ferry/tls.h"
#endif

#endif /* FERRY_FERRY_H */
