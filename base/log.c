/* log.c - ferry's log hook (ferry_set_log()) and ferry__log().
 * Thread: any; the hook is set before loops run, as ferry/loop.h asks.
 */
#include <stdarg.h>
#include <stdio.h>

#include "log.h"

static ferry_log_fn log_fn; /* set before loops run (documented) */
static void *log_ctx;

void ferry_set_log(ferry_log_fn fn, void *ctx)
{
    log_fn = fn;
    log_ctx = ctx;
}

void ferry__log(int level, const char *fmt, ...)
{
    char buf[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (log_fn)
        log_fn(level, buf, log_ctx);
    else
        fprintf(stderr, "ferry: %s: %s\n", level >= FERRY_LOG_ERROR ? "error" : "warning", buf);
}
