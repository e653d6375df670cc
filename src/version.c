/* version.c - the running library's version (ferry/version.h is the
 * headers' one).  Any thread: the answers are constants.
 */
#include "loop_only.h"

#include "ferry/loop.h"
#include "ferry/version.h"

const char *ferry_version(void)
{
    return FERRY_VERSION;
}

int ferry_version_number(void)
{
    return FERRY_VERSION_NUMBER;
}
