/* tls_corpus.c - replay the committed corpus of the TLS fuzz target
 * (corpus-tls/) in every build, libFuzzer or not.
 *
 *   tls_corpus DIR    exit 0 if the plaintext of every input arrived intact
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tls_script.h"

int main(int argc, char **argv)
{
    static unsigned char buf[TLS_SCRIPT_MAX];
    char path[4096], why[512];
    int runs = 0, failed = 0;
    struct dirent *e;
    DIR *d;

    if (argc != 2 || !(d = opendir(argv[1]))) {
        fprintf(stderr, "usage: tls_corpus DIR\n");
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
        if (tls_script_run(buf, n, why, sizeof why) != 0) {
            failed++;
            fprintf(stderr, "tls script %s: FAILED: %s\n", e->d_name, why);
        }
    }
    closedir(d);
    printf("tls corpus: %d inputs replayed, %d failed\n", runs, failed);
    if (!runs)
        fprintf(stderr, "tls corpus: no input in %s\n", argv[1]);
    return failed || !runs ? 1 : 0;
}
