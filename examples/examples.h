/* examples.h - what the example programs share: the entry point of each
 * scenario (ferry-demo calls them in turn) and two small helpers.
 *
 * Every example is a standalone program: its main() calls its ex_*()
 * function, which prints what it measured and returns 0 when everything it
 * demonstrates held, 1 otherwise.  Built into ferry-demo (FERRY_DEMO
 * defined), the files leave out their main().
 */
#ifndef FERRY_EXAMPLES_H
#define FERRY_EXAMPLES_H

#include <errno.h>
#include <stdint.h>

#include "ferry/ferry.h"

int ex_hello(void);
int ex_race_lock(void);
int ex_rate_cache(void);
int ex_singleflight(void);
int ex_upload_limit(void);
int ex_poll_stop(void);
int ex_pipeline(void);
int ex_actor(void);
int ex_condition(void);
int ex_cancel(void);
int ex_blocking_call(void);
int ex_from_thread(void);
int ex_mixed_channel(void);
int ex_sqlite_wrap(void);

/* Milliseconds elapsed since `t0` (a ferry_now() value). */
static inline double ms_since(int64_t t0)
{
    return (double)(ferry_now() - t0) / 1e6;
}

/* The name of a ferry return code, for printing. */
static inline const char *errname(int rc)
{
    switch (rc) {
    case 0:             return "0";
    case -ECANCELED:    return "-ECANCELED";
    case -ETIMEDOUT:    return "-ETIMEDOUT";
    case -EAGAIN:       return "-EAGAIN";
    case -EPERM:        return "-EPERM";
    case -EDEADLK:      return "-EDEADLK";
    case -EOVERFLOW:    return "-EOVERFLOW";
    case -ESHUTDOWN:    return "-ESHUTDOWN";
    case -ENOMEM:       return "-ENOMEM";
    case -EINVAL:       return "-EINVAL";
    case -EOWNERDEAD:   return "-EOWNERDEAD";
    case -EBUSY:        return "-EBUSY";
    case -EIO:          return "-EIO";
    default:            return "(other error)";
    }
}

#endif /* FERRY_EXAMPLES_H */
