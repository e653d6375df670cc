/* corpus_replay.c - replay the committed corpus of a fuzz target in every
 * build, libFuzzer or not.  Built once per target: as stream_corpus (the
 * line reader's scripts, corpus-stream/) and, with -DCORPUS_TLS, as
 * tls_corpus (TLS record boundaries, corpus-tls/).
 *
 *   stream_corpus DIR    exit 0 if every script matched the reference
 *   tls_corpus DIR       exit 0 if the plaintext of every input arrived intact
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CORPUS_TLS
#include "tls_script.h"
#define CORPUS_NAME "tls"
#define CORPUS_MAX  TLS_SCRIPT_MAX
#define corpus_run  tls_script_run
#else
#include "stream_script.h"
#define CORPUS_NAME "stream"
#define CORPUS_MAX  STREAM_SCRIPT_MAX
#define corpus_run  stream_script_run
#endif

int main(int argc, char **argv)
{
    static unsigned char buf[CORPUS_MAX];
    char path[4096], why[512];
    int runs = 0, failed = 0;
    struct dirent *e;
    DIR *d;

    if (argc != 2 || !(d = opendir(argv[1]))) {
        fprintf(stderr, "usage: " CORPUS_NAME "_corpus DIR\n");
        return 2;
    }
    while ((e = readdir(d)) != NULL) {
        FILE *f;
        size_t n;

        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", argv[1], e->d_name);
        if (!(f = fopen(path, "rb")))
            continue;
        n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        runs++;
        if (corpus_run(buf, n, why, sizeof why) != 0) {
            failed++;
            fprintf(stderr, CORPUS_NAME " input %s: FAILED: %s\n", e->d_name, why);
        }
    }
    closedir(d);
    printf(CORPUS_NAME " corpus: %d inputs replayed, %d failed\n", runs, failed);
    if (!runs)
        fprintf(stderr, CORPUS_NAME " corpus: no input in %s\n", argv[1]);
    return failed || !runs ? 1 : 0;
}
