/* stream_corpus.c - replay the committed corpus of the line reader's fuzz
 * target (corpus-stream/) in every build, libFuzzer or not.
 *
 *   stream_corpus DIR    exit 0 if every script matched the reference
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stream_script.h"

int main(int argc, char **argv)
{
    static unsigned char buf[STREAM_SCRIPT_MAX];
    char path[4096], why[512];
    int runs = 0, failed = 0;
    struct dirent *e;
    DIR *d;

    if (argc != 2 || !(d = opendir(argv[1]))) {
        fprintf(stderr, "usage: stream_corpus DIR\n");
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
        if (stream_script_run(buf, n, why, sizeof why) != 0) {
            failed++;
            fprintf(stderr, "stream script %s: FAILED: %s\n", e->d_name, why);
        }
    }
    closedir(d);
    printf("stream corpus: %d scripts replayed, %d failed\n", runs, failed);
    if (!runs)
        fprintf(stderr, "stream corpus: no script in %s\n", argv[1]);
    return failed || !runs ? 1 : 0;
}
