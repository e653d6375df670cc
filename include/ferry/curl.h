/* ferry/curl.h - HTTP (and everything else libcurl speaks) for tasks.
 *
 * A library of its own, ferry_curl (pkg-config ferry-curl), built when
 * libcurl's development files are found.  Each loop gets one curl multi
 * handle, made at the first transfer on that loop and freed with the loop,
 * driven through the loop with libcurl's multi_socket API on the kit of
 * ferry/watch.h.  Transfers of a loop share that handle's connection cache:
 * HTTP/1.1 keep-alive, and HTTP/2 multiplexing where libcurl was built with
 * it (CURLMOPT_PIPELINING is set to CURLPIPE_MULTIPLEX).
 *
 * A task performs an easy handle it has set up the usual way
 * (curl_easy_setopt) and suspends until the transfer is done.  The task's
 * cancellation and deadlines (ferry_scope_enter) take the transfer out of
 * the multi handle at once; the easy handle is then the caller's again,
 * reusable.  libcurl's own error comes back as a CURLcode beside ferry's
 * status.
 *
 * Everything here runs on the loop's thread, in a task.  Callbacks set on
 * an easy handle (CURLOPT_WRITEFUNCTION and the others) run on the loop's
 * thread outside any task: they must not suspend, and they must not call
 * into libcurl's multi interface or back into this header (such calls are
 * refused: libcurl does not allow re-entry from its own callbacks).
 *
 * libcurl's global state: the first transfer of the process calls
 * curl_global_init() if the program has not, which is not thread-safe.  A
 * program with loops on several threads (ferry/runtime.h) calls
 * curl_global_init(CURL_GLOBAL_DEFAULT) itself before starting them.
 */
#ifndef FERRY_CURL_H
#define FERRY_CURL_H

#include <stddef.h>

#include <curl/curl.h>

#include "ferry/loop.h"

/*
 * Perform the transfer `easy` on the calling task's loop and suspend until
 * it is done.  `easy` must not be in a multi handle already, and must not
 * be touched by anyone else until this returns.  Its options, including
 * CURLOPT_PRIVATE, stay yours: ferry sets none.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0           the transfer completed, *code_out is CURLE_OK;
 *          -EIO        libcurl ended it with an error: *code_out says which
 *                      (a failed connect, a peer that closed mid-response,
 *                      CURLE_OPERATION_TIMEDOUT for curl's own timeouts);
 *          -ECANCELED, -ETIMEDOUT   the task was cancelled or its deadline
 *                      passed: the transfer was taken out at once;
 *                      *code_out is CURLE_ABORTED_BY_CALLBACK;
 *          -ENOMEM     the loop's multi handle could not be made, or
 *                      libcurl ran out of memory adding the handle;
 *          -EBUSY      `easy` is in a multi handle already;
 *          -EDEADLK    called while libcurl runs on this loop (its callbacks
 *                      run outside tasks, so from one of them the answer
 *                      is usually -EPERM);
 *          -EPERM      not in a task; -EINVAL  easy NULL.
 * On every return `easy` is out of the multi handle, yours and reusable.
 * `code_out` may be NULL.
 */
int ferry_curl_perform(CURL *easy, CURLcode *code_out /* OUT, optional */);

/*
 * The multi handle of `loop`, made now if it has none, for
 * curl_multi_setopt() of limits such as CURLMOPT_MAX_HOST_CONNECTIONS or
 * CURLMOPT_MAXCONNECTS.  Do not set its socket or timer callbacks, and do
 * not add or remove handles yourself.
 * Thread: loop.  Suspends: no.
 * Returns: 0 and *out; -ENOMEM; -EPERM (not on the loop's thread);
 * -EINVAL (out NULL).
 */
int ferry_curl_multi(ferry_loop *loop, CURLM **out /* OUT */);

/* ---- Bodies in memory ---------------------------------------------- */

/* The answer of ferry_curl_get() / ferry_curl_post(). */
typedef struct ferry_curl_result {
    long   status;  /* the HTTP status code (0: no response) */
    char  *body;    /* the response body, NUL-terminated (NULL before a
                     * call or after ferry_curl_result_release()) */
    size_t len;     /* bytes in body, not counting the NUL */
} ferry_curl_result;

/*
 * GET `url` and keep the body in memory.  Follows no redirects.  On
 * success *out holds the response whatever its status code.
 * Thread: loop, in a task.  Suspends: yes.
 * Owns: *out is yours after a 0 return; free it with
 *       ferry_curl_result_release().  On any other return *out is left
 *       empty (nothing to free).
 * Returns: as ferry_curl_perform(); -ENOMEM also when the body could not
 * be stored.
 */
int ferry_curl_get(const char *url, ferry_curl_result *out /* OUT */,
                   CURLcode *code_out /* OUT, optional */);

/*
 * POST `len` bytes of `body` to `url` with the Content-Type
 * `content_type` (NULL: application/octet-stream), body of the answer in
 * memory.  `body` is read during the call only.
 * Thread: loop, in a task.  Suspends: yes.
 * Owns: as ferry_curl_get().
 * Returns: as ferry_curl_get().
 */
int ferry_curl_post(const char *url, const void *body, size_t len, const char *content_type,
                    ferry_curl_result *out /* OUT */, CURLcode *code_out /* OUT, optional */);

/* Free the body of `r` and empty it; an empty result is a no-op.
 * Thread: any.  Suspends: no. */
void ferry_curl_result_release(ferry_curl_result *r);

#endif /* FERRY_CURL_H */
