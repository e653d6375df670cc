/* log.h - ferry's log: one hook for the process, stderr by default.
 * Thread: any.
 */
#ifndef FERRY_BASE_LOG_H
#define FERRY_BASE_LOG_H

#include "ferry/loop.h" /* FERRY_LOG_*, ferry_set_log() */

/* Log a line through the hook set by ferry_set_log(), or to stderr. */
void ferry__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* FERRY_BASE_LOG_H */
