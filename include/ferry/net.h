/* ferry/net.h - deprecated: the earlier name of ferry/resolve.h.
 *
 * Name resolution (ferry_getaddrinfo() and the loop's resolver) is declared
 * in ferry/resolve.h; sockets (listen, accept, connect) are in
 * ferry/stream.h.  This header only includes ferry/resolve.h, for programs
 * written when it was called net.h; new code includes ferry/resolve.h (or
 * ferry/ferry.h).
 */
#ifndef FERRY_NET_H
#define FERRY_NET_H

#include "ferry/resolve.h"

#endif /* FERRY_NET_H */
