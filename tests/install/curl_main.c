/* curl_main.c - a program built out of tree against an installed ferry's
 * libcurl part (ferry::ferry_curl, pkg-config ferry-curl), by
 * tests/install/check.sh.  No server is needed: it fetches from a port of
 * 127.0.0.1 where nothing listens and exits 0 only if libcurl's refusal
 * comes back as -EIO with CURLE_COULDNT_CONNECT and nothing to free.
 */
#include <errno.h>
#include <stdio.h>

#include <ferry/ferry.h>
#include <ferry/curl.h>

static int main_task(void *arg)
{
    ferry_curl_result res = { 0 };
    CURLcode code = CURLE_OK;
    int rc = ferry_curl_get("http://127.0.0.1:1/", &res, &code);

    (void)arg;
    if (rc != -EIO || code != CURLE_COULDNT_CONNECT || res.body != NULL) {
        fprintf(stderr, "curl_main: get gave %d, CURLcode %d\n", rc, (int)code);
        return 1;
    }
    return 0;
}

int main(void)
{
#if !FERRY_HAVE_CURL
#error "the installed ferry says it has no libcurl part"
#endif
    return ferry_run(main_task, NULL);
}
