/* env.c - ferry's settings from the environment (FERRY_POOL_SIZE).
 * Thread: any.
 */
#include <stdlib.h>

#include "env.h"

unsigned ferry__env_unsigned(const char *name, unsigned dflt)
{
    const char *s = getenv(name);
    char *end;
    unsigned long v;

    if (!s || !*s)
        return dflt;
    v = strtoul(s, &end, 10);
    if (*end || v == 0 || v > 4096)
        return dflt;
    return (unsigned)v;
}
