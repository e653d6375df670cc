/* dns_conf.c - the system files a loop's resolver reads when it is made:
 * the hosts file, in a table sorted by name, and the "hosts:" line of
 * nsswitch.conf.  resolv.conf is evdns's to read; only its path is kept
 * here, beside the others, so that tests can point all of them elsewhere.
 * Loop thread only.
 */
#include "loop_only.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "dns_int.h"

/* The largest file read (a bigger one is ignored, with a log line). */
#define TEXT_MAX ((size_t)64 << 20)

/* The system files read when a resolver is made (tests point them
 * elsewhere with ferry__dns_set_files()). */
static const char *resolv_conf_path = "/etc/resolv.conf";
static const char *nsswitch_path = "/etc/nsswitch.conf";

void ferry__dns_set_files(const char *resolv_conf, const char *nsswitch_conf)
{
    resolv_conf_path = resolv_conf ? resolv_conf : "/etc/resolv.conf";
    nsswitch_path = nsswitch_conf ? nsswitch_conf : "/etc/nsswitch.conf";
}

const char *ferry__dns_resolv_conf(void)
{
    return resolv_conf_path;
}

/* Read the whole file into a NUL-terminated buffer of *len bytes before
 * the NUL.  A file that cannot be read counts as empty (0 and *text NULL);
 * only memory is an error. */
static int read_text(const char *path, char **text, size_t *len)
{
    struct stat st;
    char *buf;
    FILE *f;

    *text = NULL;
    *len = 0;
    f = fopen(path, "re");
    if (!f)
        return 0;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 0) {
        fclose(f);
        return 0;
    }
    if ((size_t)st.st_size > TEXT_MAX) {
        ferry__log(FERRY_LOG_WARN, "resolver: %s is larger than %zu bytes: not read", path,
                   TEXT_MAX);
        fclose(f);
        return 0;
    }
    buf = ferry__malloc((size_t)st.st_size + 1);
    if (!buf) {
        fclose(f);
        return -ENOMEM;
    }
    *len = fread(buf, 1, (size_t)st.st_size, f);
    fclose(f);
    buf[*len] = 0;
    *text = buf;
    return 0;
}

/*
 * The line of text[0, len) that starts at *pos, cut at its newline in
 * place, and *pos moved past it; NULL after the last.  Lines are found by
 * length, not by NUL: a NUL byte in a line ends what a C string of it
 * reads, as it does for glibc's readers of these files (a line at a time,
 * then C strings), and the lines after it still count.
 */
static char *next_line(char *text, size_t len, size_t *pos)
{
    char *line, *nl;

    if (*pos >= len)
        return NULL;
    line = text + *pos;
    nl = memchr(line, '\n', len - *pos);
    if (nl) {
        *nl = 0;
        *pos = (size_t)(nl - text) + 1;
    } else {
        *pos = len; /* text[len] is the NUL read_text() put there */
    }
    return line;
}

/* ---- the hosts file ---------------------------------------------------------- */

static int ent_cmp(const void *a, const void *b)
{
    const struct ferry__hosts_ent *x = a, *y = b;
    int c = strcasecmp(x->name, y->name);

    if (c)
        return c;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

void ferry__hosts_free(struct ferry__hosts *h)
{
    ferry__free(h->ents);
    ferry__free(h->text);
    h->ents = NULL;
    h->text = NULL;
    h->n = 0;
}

int ferry__hosts_load(struct ferry__hosts *h, const char *path)
{
    size_t cap = 0, len, pos = 0;
    unsigned seq = 0;
    char *line;
    int rc = read_text(path, &h->text, &len);

    if (rc || !h->text)
        return rc;
    while ((line = next_line(h->text, len, &pos)) != NULL) {
        unsigned char addr[16];
        const char *canon = NULL;
        char *tok, *save, *hash;
        int family;

        if ((hash = strchr(line, '#')))
            *hash = 0;
        tok = strtok_r(line, " \t\r", &save);
        if (!tok)
            continue;
        if (inet_pton(AF_INET, tok, addr) == 1)
            family = AF_INET;
        else if (inet_pton(AF_INET6, tok, addr) == 1)
            family = AF_INET6;
        else
            continue;
        while ((tok = strtok_r(NULL, " \t\r", &save))) {
            struct ferry__hosts_ent *e;

            if (h->n == cap) {
                size_t ncap = cap ? cap * 2 : 16;
                struct ferry__hosts_ent *grown = ferry__realloc(h->ents, ncap * sizeof *grown);
                if (!grown) {
                    ferry__hosts_free(h);
                    return -ENOMEM;
                }
                h->ents = grown;
                cap = ncap;
            }
            if (!canon)
                canon = tok;
            e = &h->ents[h->n++];
            e->name = tok;
            e->canon = canon;
            e->seq = seq++;
            e->family = family;
            memcpy(e->addr, addr, family == AF_INET ? 4 : 16);
        }
    }
    if (h->n)
        qsort(h->ents, h->n, sizeof *h->ents, ent_cmp);
    return 0;
}

const struct ferry__hosts_ent *ferry__hosts_find(const struct ferry__hosts *h, const char *name,
                                                 size_t *count)
{
    size_t lo = 0, hi = h->n, end;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcasecmp(h->ents[mid].name, name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (end = lo; end < h->n && strcasecmp(h->ents[end].name, name) == 0; end++)
        ;
    *count = end - lo;
    return end > lo ? &h->ents[lo] : NULL;
}

/* ---- nsswitch.conf ------------------------------------------------------------- */

int ferry__nss_read(bool *files, bool *dns, bool *other)
{
    char *text, *line;
    size_t len, pos = 0;
    bool found = false;
    int rc = read_text(nsswitch_path, &text, &len);

    *files = *dns = true;
    *other = false;
    if (rc || !text)
        return rc;
    while (!found && (line = next_line(text, len, &pos)) != NULL) {
        char *p = line, *tok, *save;

        if ((tok = strchr(line, '#')))
            *tok = 0;
        p += strspn(p, " \t");
        if (strncmp(p, "hosts:", 6) != 0)
            continue;
        found = true;
        *files = *dns = false;
        for (tok = strtok_r(p + 6, " \t\r", &save); tok; tok = strtok_r(NULL, " \t\r", &save)) {
            if (tok[0] == '[') {
                /* An action, "[NOTFOUND=return]", perhaps over tokens. */
                while (tok && !strchr(tok, ']'))
                    tok = strtok_r(NULL, " \t\r", &save);
                if (!tok)
                    break;
                continue;
            }
            if (strcmp(tok, "files") == 0)
                *files = true;
            else if (strcmp(tok, "dns") == 0)
                *dns = true;
            else
                *other = true;
        }
    }
    ferry__free(text);
    return 0;
}
