/* model_corpus.c - replay every file of a corpus directory (the committed
 * seed corpus of the fuzz target, tests/reliability/corpus/) through the
 * model-based tester, in any build: the fuzz target's inputs are checked in
 * gcc, ASan, TSan and valgrind builds too, not only under libFuzzer.
 *
 *   model_corpus DIR     prints "model: N sequences checked, F failed"
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

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
        }
    }
    closedir(d);
    ferry_loop_free(loop);
    if (n == 0) {
        printf("model: corpus %s is empty\n", argv[1]);
        return 1;
    }
    printf("model: %lu sequences checked, %lu failed\n", n, failed);
    return failed ? 1 : 0;
}
