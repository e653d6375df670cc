/* model_corpus.c - replay every file of a corpus directory (the committed
 * corpus, tests/reliability/corpus/: the stored regressions regress-* and
 * the fuzz target's seed inputs) through the model-based tester, in any
 * build: they are checked in gcc, ASan, TSan and valgrind builds too, not
 * only under libFuzzer.  After a failing file the next one gets a new loop
 * (the failed one may hold tasks that never end).
 *
 *   model_corpus DIR     prints "model: N sequences checked, F failed";
 *                        an empty or unreadable corpus fails
 *
 * Not a Criterion test (so without the shared teardown of testutil.c):
 * each sequence is checked as ferry-model checks it.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#define MAX_BROKEN 32
static ferry_loop *broken[MAX_BROKEN + 1];
static int nbroken;

int main(int argc, char **argv)
{
    static uint8_t buf[1 << 16];
    unsigned long n = 0, failed = 0;
    ferry_loop *loop;
    model_report rep;
    struct dirent *de;
    DIR *d;

    if (argc != 2 || !(d = opendir(argv[1]))) {
        fprintf(stderr, "usage: model_corpus DIR\n");
        return 2;
    }
    if (model_loop_new(&loop))
        return 2;
    while ((de = readdir(d)) != NULL) {
        char path[4096];
        size_t len;
        FILE *f;

        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", argv[1], de->d_name);
        if (!(f = fopen(path, "rb")))
            continue;
        len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        n++;
        if (model_check_bytes(loop, buf, len, NULL, &rep)) {
            failed++;
            printf("model: FAILED corpus file %s at op %d: %s\n", de->d_name, rep.op_index, rep.msg);
            /* Never run or free the failed loop again; keep it reachable. */
            broken[nbroken++] = loop;
            loop = NULL;
            if (nbroken > MAX_BROKEN || model_loop_new(&loop))
                break;
        }
    }
    closedir(d);
    ferry_loop_free(loop);
    if (n == 0) {
        printf("model: corpus %s is empty\n", argv[1]);
        return 1;
    }
    if (model_stray_callbacks()) {
        printf("model: FAILED: %lu timer or posted callbacks ran after their sequence\n",
               model_stray_callbacks());
        failed++;
    }
    printf("model: %lu sequences checked, %lu failed\n", n, failed);
    return failed ? 1 : 0;
}
