/* addrinfo.c - address lists in blocks of ferry's own allocator, and the
 * codes of name resolution.  Any thread.
 *
 * Every list ferry_getaddrinfo() returns is one block of ferry__malloc():
 * a header with a mark, the entries, their socket addresses and the
 * canonical name.  So ferry_freeaddrinfo() is one free whoever made the
 * list (the loop's resolver or a pool thread), a list costs one allocation,
 * and the allocation-failure tests reach it.
 */
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>

#include "addrinfo.h"
#include "alloc.h"
#include "log.h"

/* The mark at the head of a live block: ferry_freeaddrinfo() checks it to
 * catch a list that is not ferry's, or one freed twice while its memory
 * still holds the cleared mark. */
#define AI_MARK UINT64_C(0x6665727279616930)

struct ai_block {
    uint64_t mark;        /* AI_MARK while the block is live, 0 once freed */
    size_t n;             /* entries */
    struct addrinfo ai[]; /* n entries, then n socket address slots, then the name */
};

/* ---- lists ---------------------------------------------------------------- */

/* A block for n entries and a canonical name of `canon_len` bytes (0: none). */
static struct ai_block *block_new(size_t n, size_t canon_len)
{
    size_t size = sizeof(struct ai_block) + n * sizeof(struct addrinfo) +
                  n * sizeof(struct sockaddr_in6) + canon_len;
    struct ai_block *b;

    /* Callers bound n (at most a few hundred entries) and canon_len (a
     * name of at most a few hundred bytes), so the sum cannot wrap. */
    b = ferry__malloc(size);
    if (!b)
        return NULL;
    memset(b, 0, size);
    b->mark = AI_MARK;
    b->n = n;
    return b;
}

static struct sockaddr_in6 *block_slot(struct ai_block *b, size_t i)
{
    return (struct sockaddr_in6 *)(void *)&b->ai[b->n] + i;
}

static char *block_name(struct ai_block *b)
{
    return (char *)block_slot(b, b->n);
}

/* Link the entries and give the first one the name. */
static void block_finish(struct ai_block *b, const char *canon, size_t canon_len)
{
    for (size_t i = 0; i + 1 < b->n; i++)
        b->ai[i].ai_next = &b->ai[i + 1];
    if (canon_len) {
        memcpy(block_name(b), canon, canon_len);
        b->ai[0].ai_canonname = block_name(b);
    }
}

int ferry__ai_build(struct addrinfo **out, const struct ferry__ai_addr *addrs, size_t naddrs,
                    const struct ferry__ai_kind *kinds, size_t nkinds, const char *canon)
{
    size_t canon_len = canon ? strlen(canon) + 1 : 0, k = 0;
    struct ai_block *b;

    *out = NULL;
    b = block_new(naddrs * nkinds, canon_len);
    if (!b)
        return -ENOMEM;
    for (size_t i = 0; i < naddrs; i++) {
        for (size_t j = 0; j < nkinds; j++, k++) {
            struct addrinfo *ai = &b->ai[k];
            struct sockaddr_in6 *slot = block_slot(b, k);

            ai->ai_family = addrs[i].family;
            ai->ai_socktype = kinds[j].socktype;
            ai->ai_protocol = kinds[j].protocol;
            ai->ai_addr = (struct sockaddr *)(void *)slot;
            if (addrs[i].family == AF_INET) {
                struct sockaddr_in *sin = (struct sockaddr_in *)(void *)slot;
                sin->sin_family = AF_INET;
                sin->sin_port = kinds[j].port;
                memcpy(&sin->sin_addr, addrs[i].bytes, 4);
                ai->ai_addrlen = sizeof *sin;
            } else {
                slot->sin6_family = AF_INET6;
                slot->sin6_port = kinds[j].port;
                memcpy(&slot->sin6_addr, addrs[i].bytes, 16);
                ai->ai_addrlen = sizeof *slot;
            }
        }
    }
    block_finish(b, canon, canon_len);
    *out = &b->ai[0];
    return 0;
}

int ferry__ai_copy(struct addrinfo **out, const struct addrinfo *src)
{
    const struct addrinfo *s;
    size_t n = 0, k = 0, canon_len;
    struct ai_block *b;

    *out = NULL;
    /* Entries whose address would not fit a slot are left out; getaddrinfo
     * only makes AF_INET and AF_INET6 ones for the families ferry asks. */
    for (s = src; s; s = s->ai_next)
        if (s->ai_addr && s->ai_addrlen <= sizeof(struct sockaddr_in6))
            n++;
    if (!n)
        return FERRY_EAI_NODATA;
    canon_len = src->ai_canonname ? strlen(src->ai_canonname) + 1 : 0;
    b = block_new(n, canon_len);
    if (!b)
        return -ENOMEM;
    for (s = src; s; s = s->ai_next) {
        if (!s->ai_addr || s->ai_addrlen > sizeof(struct sockaddr_in6))
            continue;
        b->ai[k].ai_flags = s->ai_flags;
        b->ai[k].ai_family = s->ai_family;
        b->ai[k].ai_socktype = s->ai_socktype;
        b->ai[k].ai_protocol = s->ai_protocol;
        b->ai[k].ai_addrlen = s->ai_addrlen;
        b->ai[k].ai_addr = (struct sockaddr *)(void *)block_slot(b, k);
        memcpy(block_slot(b, k), s->ai_addr, s->ai_addrlen);
        k++;
    }
    block_finish(b, src->ai_canonname, canon_len);
    *out = &b->ai[0];
    return 0;
}

void ferry_freeaddrinfo(struct addrinfo *res)
{
    struct ai_block *b;

    if (!res)
        return;
    b = (struct ai_block *)(void *)((char *)res - offsetof(struct ai_block, ai));
    if (b->mark != AI_MARK) {
        ferry__log(FERRY_LOG_ERROR,
                   "ferry_freeaddrinfo: %p is not a list from "
                   "ferry_getaddrinfo() (or it was freed already): ignored",
                   (void *)res);
        return;
    }
    b->mark = 0;
    ferry__free(b);
}

/* ---- codes ---------------------------------------------------------------- */

int ferry__gai_code(int eai, int err)
{
    switch (eai) {
    case 0:
        return 0;
    case EAI_NONAME:
        return FERRY_EAI_NONAME;
    case EAI_AGAIN:
        return FERRY_EAI_AGAIN;
    case EAI_FAIL:
        return FERRY_EAI_FAIL;
#ifdef EAI_NODATA
    case EAI_NODATA:
        return FERRY_EAI_NODATA;
#endif
#ifdef EAI_ADDRFAMILY
    case EAI_ADDRFAMILY:
        return FERRY_EAI_NODATA;
#endif
    case EAI_SERVICE:
        return FERRY_EAI_SERVICE;
    case EAI_FAMILY:
        return FERRY_EAI_FAMILY;
    case EAI_SOCKTYPE:
        return FERRY_EAI_SOCKTYPE;
    case EAI_MEMORY:
        return -ENOMEM;
    case EAI_BADFLAGS:
        return -EINVAL;
    case EAI_SYSTEM:
        return err > 0 ? -err : FERRY_EAI_FAIL;
    default:
        return FERRY_EAI_FAIL;
    }
}

const char *ferry_gai_strerror(int code)
{
    switch (code) {
    case 0:
        return "success";
    case FERRY_EAI_NONAME:
        return "name or service not known";
    case FERRY_EAI_AGAIN:
        return "temporary failure in name resolution";
    case FERRY_EAI_FAIL:
        return "non-recoverable failure in name resolution";
    case FERRY_EAI_NODATA:
        return "no address of the requested family for the name";
    case FERRY_EAI_SERVICE:
        return "service not known for the socket type";
    case FERRY_EAI_FAMILY:
        return "address family not supported";
    case FERRY_EAI_SOCKTYPE:
        return "socket type not supported";
    default:
        if (code < 0 && code > -4096)
            return strerror(-code);
        return "unknown error code";
    }
}
