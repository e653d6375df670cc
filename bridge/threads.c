/* threads.c - one-time process setup for crossing threads.
 * Any thread.
 */
#include <pthread.h>

#include <event2/thread.h>

#include "ferry_int.h"

static pthread_once_t threads_once = PTHREAD_ONCE_INIT;

static void threads_setup(void)
{
    /* libevent's own locks: needed for event_active() and for any libevent
     * call made on a base from another thread. */
    evthread_use_pthreads();
}

void ferry__threads_init(void)
{
    pthread_once(&threads_once, threads_setup);
}
