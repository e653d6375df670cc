/* test_ctx.c - the context switch on its own: ferry__ctx_make() and
 * ferry__ctx_switch() with no loop, no libevent and no Criterion, so that
 * the same file cross-builds for aarch64 and runs under qemu-aarch64
 * (tests/ctx/run-aarch64.sh).
 *
 * Checked: ping-pong between main and several contexts, direct
 * context-to-context switches, every callee-saved register (general and,
 * on aarch64, d8-d15) surviving a switch while the other side clobbers
 * them, values the compiler keeps in registers across switches, 16-byte
 * stack alignment inside a context (aligned locals, alloca, printf("%f"),
 * SSE on x86_64), deep recursion on a context stack with a switch at the
 * bottom, and many contexts alive at once.
 *
 * Prints one line per check and "N passed, N failed"; exits non-zero on
 * any failure.  A crash ends the program, which also fails it.  It makes
 * no loop and links no Criterion, so the shared teardown of testutil.c
 * (no leftover on the loop, every allocation given back) has nothing to
 * check here.
 */
#include <inttypes.h>
#include <alloca.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define HAVE_VALGRIND_H 1
#endif
#endif

#include "ctx.h"

static int checks_failed;

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "  %s:%d: check failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                    \
            checks_failed++;                                                   \
        }                                                                      \
    } while (0)

/* ---- stacks ------------------------------------------------------------ */

struct stack {
    void *map;      /* the whole mapping, guard page first */
    size_t len;
    void *lo;       /* usable stack: [lo, lo + size) */
    size_t size;
    unsigned vg_id; /* valgrind's id for the stack (0 outside valgrind) */
};

static struct stack stack_new(size_t size)
{
    struct stack s;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size = (size + page - 1) / page * page;
    s.len = size + page;
    s.map = mmap(NULL, s.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s.map == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    if (mprotect(s.map, page, PROT_NONE) != 0) {
        perror("mprotect");
        exit(2);
    }
    s.lo = (char *)s.map + page;
    s.size = size;
    s.vg_id = 0;
#ifdef HAVE_VALGRIND_H
    /* Without it, switches between adjacent stacks look like huge frame
     * pushes to memcheck (docs/testing.md, the valgrind leg). */
    s.vg_id = VALGRIND_STACK_REGISTER(s.lo, (char *)s.lo + s.size);
#endif
    return s;
}

static void stack_free(struct stack *s)
{
#ifdef HAVE_VALGRIND_H
    VALGRIND_STACK_DEREGISTER(s->vg_id);
#endif
    munmap(s->map, s->len);
}

/* Keep the compiler from knowing a pointer's value (and so its alignment). */
static uintptr_t launder(const void *p)
{
    uintptr_t v = (uintptr_t)p;
    __asm__ volatile("" : "+r"(v));
    return v;
}

/* ---- 1. ping-pong between main and two contexts ---------------------------- */

static ferry__ctx main_ctx, ctx_a, ctx_b;
static char trace[64];
static size_t trace_len;

static void note(char c)
{
    if (trace_len + 1 < sizeof trace)
        trace[trace_len++] = c;
}

static void pp_a(void *arg)
{
    CHECK(arg == (void *)&ctx_a);
    for (int i = 0; i < 3; i++) {
        note('a');
        ferry__ctx_switch(&ctx_a, &ctx_b);     /* context to context */
    }
    note('A');
    ferry__ctx_switch(&ctx_a, &main_ctx);
    abort();    /* never resumed */
}

static void pp_b(void *arg)
{
    CHECK(arg == (void *)&ctx_b);
    for (int i = 0; i < 3; i++) {
        note('b');
        ferry__ctx_switch(&ctx_b, &main_ctx);  /* context to main */
    }
    abort();    /* never resumed */
}

static void test_ping_pong(void)
{
    struct stack sa = stack_new(64 * 1024), sb = stack_new(64 * 1024);
    trace_len = 0;
    ferry__ctx_make(&ctx_a, sa.lo, sa.size, pp_a, &ctx_a);
    ferry__ctx_make(&ctx_b, sb.lo, sb.size, pp_b, &ctx_b);
    for (int i = 0; i < 3; i++) {
        note('m');
        ferry__ctx_switch(&main_ctx, &ctx_a);  /* resumes a; b comes back */
    }
    note('M');
    ferry__ctx_switch(&main_ctx, &ctx_a);      /* a's last step */
    trace[trace_len] = '\0';
    CHECK(strcmp(trace, "mabmabmabMA") == 0);
    if (strcmp(trace, "mabmabmabMA") != 0)
        fprintf(stderr, "  trace: %s\n", trace);
    stack_free(&sa);
    stack_free(&sb);
}

/* ---- 2. callee-saved registers survive, both ways ------------------------------ */

/*
 * regs_roundtrip(from, to, seed, out): load every callee-saved register
 * with seed + i, call ferry__ctx_switch(from, to), and when resumed store
 * them all in out[] before restoring the caller's.  Both sides run it with
 * different seeds, so each side's registers are clobbered by the other's.
 */
void regs_roundtrip(ferry__ctx *from, ferry__ctx *to, uint64_t seed, uint64_t *out);

#if defined(__x86_64__)
#define NREGS 6     /* rbx rbp r12 r13 r14 r15 */
__asm__(
    "    .text\n"
    "    .globl regs_roundtrip\n"
    "    .type regs_roundtrip, @function\n"
    "regs_roundtrip:\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    pushq %rcx\n"              /* out; rsp is now 16-byte aligned */
    "    movq %rdx, %rbx\n"
    "    leaq 1(%rdx), %rbp\n"
    "    leaq 2(%rdx), %r12\n"
    "    leaq 3(%rdx), %r13\n"
    "    leaq 4(%rdx), %r14\n"
    "    leaq 5(%rdx), %r15\n"
    "    call ferry__ctx_switch\n"
    "    popq %rcx\n"
    "    movq %rbx, 0(%rcx)\n"
    "    movq %rbp, 8(%rcx)\n"
    "    movq %r12, 16(%rcx)\n"
    "    movq %r13, 24(%rcx)\n"
    "    movq %r14, 32(%rcx)\n"
    "    movq %r15, 40(%rcx)\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    "    .size regs_roundtrip, .-regs_roundtrip\n");
#elif defined(__aarch64__)
#define NREGS 19    /* x19-x29, d8-d15 */
__asm__(
    "    .text\n"
    "    .globl regs_roundtrip\n"
    "    .type regs_roundtrip, %function\n"
    "regs_roundtrip:\n"
    "    stp x29, x30, [sp, #-176]!\n"
    "    stp x19, x20, [sp, #16]\n"
    "    stp x21, x22, [sp, #32]\n"
    "    stp x23, x24, [sp, #48]\n"
    "    stp x25, x26, [sp, #64]\n"
    "    stp x27, x28, [sp, #80]\n"
    "    stp d8, d9, [sp, #96]\n"
    "    stp d10, d11, [sp, #112]\n"
    "    stp d12, d13, [sp, #128]\n"
    "    stp d14, d15, [sp, #144]\n"
    "    str x3, [sp, #160]\n"
    "    mov x19, x2\n"
    "    add x20, x2, #1\n"
    "    add x21, x2, #2\n"
    "    add x22, x2, #3\n"
    "    add x23, x2, #4\n"
    "    add x24, x2, #5\n"
    "    add x25, x2, #6\n"
    "    add x26, x2, #7\n"
    "    add x27, x2, #8\n"
    "    add x28, x2, #9\n"
    "    add x29, x2, #10\n"
    "    add x9, x2, #11\n    fmov d8, x9\n"
    "    add x9, x2, #12\n    fmov d9, x9\n"
    "    add x9, x2, #13\n    fmov d10, x9\n"
    "    add x9, x2, #14\n    fmov d11, x9\n"
    "    add x9, x2, #15\n    fmov d12, x9\n"
    "    add x9, x2, #16\n    fmov d13, x9\n"
    "    add x9, x2, #17\n    fmov d14, x9\n"
    "    add x9, x2, #18\n    fmov d15, x9\n"
    "    bl ferry__ctx_switch\n"
    "    ldr x3, [sp, #160]\n"
    "    stp x19, x20, [x3, #0]\n"
    "    stp x21, x22, [x3, #16]\n"
    "    stp x23, x24, [x3, #32]\n"
    "    stp x25, x26, [x3, #48]\n"
    "    stp x27, x28, [x3, #64]\n"
    "    str x29, [x3, #80]\n"
    "    fmov x9, d8\n    str x9, [x3, #88]\n"
    "    fmov x9, d9\n    str x9, [x3, #96]\n"
    "    fmov x9, d10\n    str x9, [x3, #104]\n"
    "    fmov x9, d11\n    str x9, [x3, #112]\n"
    "    fmov x9, d12\n    str x9, [x3, #120]\n"
    "    fmov x9, d13\n    str x9, [x3, #128]\n"
    "    fmov x9, d14\n    str x9, [x3, #136]\n"
    "    fmov x9, d15\n    str x9, [x3, #144]\n"
    "    ldp x19, x20, [sp, #16]\n"
    "    ldp x21, x22, [sp, #32]\n"
    "    ldp x23, x24, [sp, #48]\n"
    "    ldp x25, x26, [sp, #64]\n"
    "    ldp x27, x28, [sp, #80]\n"
    "    ldp d8, d9, [sp, #96]\n"
    "    ldp d10, d11, [sp, #112]\n"
    "    ldp d12, d13, [sp, #128]\n"
    "    ldp d14, d15, [sp, #144]\n"
    "    ldp x29, x30, [sp], #176\n"
    "    ret\n"
    "    .size regs_roundtrip, .-regs_roundtrip\n");
#else
#error "test_ctx.c: no register check for this architecture"
#endif

#define SEED_MAIN UINT64_C(0x1111000000000000)
#define SEED_CTX  UINT64_C(0x2222000000000000)

static ferry__ctx regs_main, regs_ctx;
static uint64_t regs_out_ctx[NREGS];
static int regs_rounds;

static void regs_entry(void *arg)
{
    (void)arg;
    for (;;) {
        uint64_t seed = SEED_CTX + (uint64_t)regs_rounds * 256;
        regs_roundtrip(&regs_ctx, &regs_main, seed, regs_out_ctx);
        for (int i = 0; i < NREGS; i++) {
            CHECK(regs_out_ctx[i] == seed + (uint64_t)i);
            if (regs_out_ctx[i] != seed + (uint64_t)i)
                fprintf(stderr, "  context register %d: %#" PRIx64 "\n", i, regs_out_ctx[i]);
        }
    }
}

static void test_callee_saved(void)
{
    struct stack s = stack_new(64 * 1024);
    uint64_t out[NREGS];
    ferry__ctx_make(&regs_ctx, s.lo, s.size, regs_entry, NULL);
    /* First switch starts the context; each later one resumes it inside
     * regs_roundtrip, which checks its registers, then clobbers them. */
    for (regs_rounds = 0; regs_rounds < 4; regs_rounds++) {
        uint64_t seed = SEED_MAIN + (uint64_t)regs_rounds * 256;
        regs_roundtrip(&regs_main, &regs_ctx, seed, out);
        for (int i = 0; i < NREGS; i++) {
            CHECK(out[i] == seed + (uint64_t)i);
            if (out[i] != seed + (uint64_t)i)
                fprintf(stderr, "  main register %d: %#" PRIx64 "\n", i, out[i]);
        }
    }
    stack_free(&s);
}

/* ---- 3. values the compiler keeps live across switches ------------------------ */

static ferry__ctx live_main, live_ctx;

/* The other side: trashes as many registers as the compiler will use. */
static void live_entry(void *arg)
{
    volatile double sink = 0;
    for (unsigned k = 1;; k++) {
        double a = k * 1.5, b = k * 2.25, c = k * 3.125, d = k * 0.5;
        uint64_t x = k * 7u, y = k * 11u, z = k * 13u;
        for (int i = 0; i < 8; i++) {
            a = a * 1.0001 + b;
            b = b * 0.9999 + c;
            c = c + d * 0.5;
            d = d + a * 1e-9;
            x = x * 6364136223846793005u + y;
            y ^= x >> 7;
            z += x ^ y;
        }
        sink = a + b + c + d + (double)(x ^ y ^ z);
        ferry__ctx_switch(&live_ctx, &live_main);
    }
    (void)arg;
    (void)sink;
}

/* Loop state that is live across every switch: at -O2 it stays in
 * callee-saved registers (d8-d15 for the doubles on aarch64). */
__attribute__((noinline)) static void live_values(double *dout, uint64_t *iout)
{
    double a = 1.0, b = 2.0, c = 3.0, d = 4.0, e = 5.0, f = 6.0, g = 7.0, h = 8.0;
    uint64_t p = 1, q = 2, r = 3, s = 4, t = 5;
    for (int i = 0; i < 100; i++) {
        ferry__ctx_switch(&live_main, &live_ctx);
        a += 1.0; b *= 1.5; c -= 0.25; d += a; e += b * 0.001; f += c; g -= 1.0; h += 0.5;
        p += 3; q *= 3; r ^= p; s += q; t = t * 31 + p;
    }
    dout[0] = a; dout[1] = b; dout[2] = c; dout[3] = d;
    dout[4] = e; dout[5] = f; dout[6] = g; dout[7] = h;
    iout[0] = p; iout[1] = q; iout[2] = r; iout[3] = s; iout[4] = t;
}

/* The same computation without switching. */
__attribute__((noinline)) static void live_values_ref(double *dout, uint64_t *iout)
{
    double a = 1.0, b = 2.0, c = 3.0, d = 4.0, e = 5.0, f = 6.0, g = 7.0, h = 8.0;
    uint64_t p = 1, q = 2, r = 3, s = 4, t = 5;
    for (int i = 0; i < 100; i++) {
        __asm__ volatile("" ::: "memory");
        a += 1.0; b *= 1.5; c -= 0.25; d += a; e += b * 0.001; f += c; g -= 1.0; h += 0.5;
        p += 3; q *= 3; r ^= p; s += q; t = t * 31 + p;
    }
    dout[0] = a; dout[1] = b; dout[2] = c; dout[3] = d;
    dout[4] = e; dout[5] = f; dout[6] = g; dout[7] = h;
    iout[0] = p; iout[1] = q; iout[2] = r; iout[3] = s; iout[4] = t;
}

static void test_live_values(void)
{
    struct stack s = stack_new(64 * 1024);
    double d1[8], d2[8];
    uint64_t i1[5], i2[5];
    ferry__ctx_make(&live_ctx, s.lo, s.size, live_entry, NULL);
    live_values(d1, i1);
    live_values_ref(d2, i2);
    CHECK(memcmp(d1, d2, sizeof d1) == 0);
    CHECK(memcmp(i1, i2, sizeof i1) == 0);
    stack_free(&s);
}

/* ---- 4. stack alignment inside a context --------------------------------------- */

static ferry__ctx align_main, align_ctx;
static char align_text[128];
static int align_misaligned;

__attribute__((noinline)) static void align_leaf(int n)
{
    _Alignas(16) char local[16];
    char *dyn = alloca((size_t)n);
    memset(dyn, 0, (size_t)n);
    if (launder(local) % 16 != 0 || launder(dyn) % 16 != 0)
        align_misaligned++;
    /* %f goes through code that uses aligned SSE stores on x86_64. */
    snprintf(align_text, sizeof align_text, "%f %.3Lf %g", 3.5, (long double)2.25, 1e-3);
    printf("  printf inside a context: %f\n", 0.125);
#if defined(__x86_64__)
    _Alignas(16) double v[2] = { 1.0, 2.0 };
    __m128d m = _mm_load_pd(v);     /* movapd: faults if misaligned */
    m = _mm_add_pd(m, m);
    _mm_store_pd(v, m);
    if (v[0] != 2.0 || v[1] != 4.0)
        align_misaligned++;
#endif
}

static void align_entry(void *arg)
{
    (void)arg;
    /* The entry point itself, and leaves at odd frame depths. */
    _Alignas(16) char here[16] = { 0 };
    if (launder(here) % 16 != 0)
        align_misaligned++;
    align_leaf(1);
    align_leaf(24);
    align_leaf(100);
    ferry__ctx_switch(&align_ctx, &align_main);
    abort();
}

static void test_alignment(void)
{
    /* A stack whose size is not a multiple of 16: ferry__ctx_make aligns. */
    struct stack s = stack_new(64 * 1024);
    align_misaligned = 0;
    ferry__ctx_make(&align_ctx, (char *)s.lo + 8, s.size - 8 - 24, align_entry, NULL);
    ferry__ctx_switch(&align_main, &align_ctx);
    CHECK(align_misaligned == 0);
    CHECK(strcmp(align_text, "3.500000 2.250 0.001") == 0);
    stack_free(&s);
}

/* ---- 5. deep recursion on a context stack -------------------------------------- */

static ferry__ctx deep_main, deep_ctx;
static uint64_t deep_result;

__attribute__((noinline)) static uint64_t recurse(int depth, uint64_t acc)
{
    volatile char pad[128];     /* about 200 bytes a frame */
    pad[depth % 128] = (char)depth;
    if (depth == 0) {
        /* Switch out at the bottom and come back. */
        ferry__ctx_switch(&deep_ctx, &deep_main);
        return acc + (uint64_t)pad[0];
    }
    uint64_t r = recurse(depth - 1, acc * 3 + (uint64_t)depth);
    return r + (uint64_t)pad[depth % 128];
}

static void deep_entry(void *arg)
{
    int depth = *(int *)arg;
    deep_result = recurse(depth, 1);
    ferry__ctx_switch(&deep_ctx, &deep_main);
    abort();
}

__attribute__((noinline)) static uint64_t recurse_ref(int depth, uint64_t acc)
{
    volatile char pad[128];
    pad[depth % 128] = (char)depth;
    if (depth == 0)
        return acc + (uint64_t)pad[0];
    uint64_t r = recurse_ref(depth - 1, acc * 3 + (uint64_t)depth);
    return r + (uint64_t)pad[depth % 128];
}

static void test_deep_recursion(void)
{
    /* 4,000 frames of about 200 bytes in a 1 MiB stack. */
    struct stack s = stack_new(1024 * 1024);
    int depth = 4000;
    deep_result = 0;
    ferry__ctx_make(&deep_ctx, s.lo, s.size, deep_entry, &depth);
    ferry__ctx_switch(&deep_main, &deep_ctx);   /* runs down to the bottom */
    CHECK(deep_result == 0);
    ferry__ctx_switch(&deep_main, &deep_ctx);   /* unwinds */
    CHECK(deep_result == recurse_ref(depth, 1));
    stack_free(&s);
}

/* ---- 6. many contexts round-robin ----------------------------------------------- */

#define MANY 100
#define MANY_ROUNDS 200

static ferry__ctx many_main, many_ctx[MANY];
static uint64_t many_sum[MANY];

static void many_entry(void *arg)
{
    int id = (int)(intptr_t)arg;
    uint64_t local = (uint64_t)id * 1000;
    for (int r = 0; r < MANY_ROUNDS; r++) {
        local += (uint64_t)r;
        many_sum[id] = local;
        /* Hand over to the next context directly; the last goes to main. */
        ferry__ctx_switch(&many_ctx[id], id + 1 < MANY ? &many_ctx[id + 1] : &many_main);
    }
    ferry__ctx_switch(&many_ctx[id], &many_main);
    abort();
}

static void test_many_contexts(void)
{
    static struct stack stacks[MANY];
    for (int i = 0; i < MANY; i++) {
        stacks[i] = stack_new(16 * 1024);
        ferry__ctx_make(&many_ctx[i], stacks[i].lo, stacks[i].size, many_entry,
                        (void *)(intptr_t)i);
    }
    for (int r = 0; r < MANY_ROUNDS; r++)
        ferry__ctx_switch(&many_main, &many_ctx[0]);
    for (int i = 0; i < MANY; i++) {
        uint64_t want = (uint64_t)i * 1000 + (uint64_t)MANY_ROUNDS * (MANY_ROUNDS - 1) / 2;
        CHECK(many_sum[i] == want);
    }
    for (int i = 0; i < MANY; i++)
        stack_free(&stacks[i]);
}

/* ---- 7. a million switches ------------------------------------------------------- */

static ferry__ctx spin_main, spin_ctx;
static long spin_count;

static void spin_entry(void *arg)
{
    (void)arg;
    for (;;) {
        spin_count++;
        ferry__ctx_switch(&spin_ctx, &spin_main);
    }
}

static void test_many_switches(void)
{
    struct stack s = stack_new(64 * 1024);
    long n = 1000000;
    if (getenv("FERRY_CTX_TEST_QUICK"))
        n = 10000;
    spin_count = 0;
    ferry__ctx_make(&spin_ctx, s.lo, s.size, spin_entry, NULL);
    for (long i = 0; i < n; i++)
        ferry__ctx_switch(&spin_main, &spin_ctx);
    CHECK(spin_count == n);
    stack_free(&s);
}

/* ---- runner ----------------------------------------------------------------------- */

static const struct {
    const char *name;
    void (*fn)(void);
} tests[] = {
    { "ping_pong", test_ping_pong },
    { "callee_saved_registers", test_callee_saved },
    { "live_values_across_switches", test_live_values },
    { "stack_alignment", test_alignment },
    { "deep_recursion", test_deep_recursion },
    { "many_contexts", test_many_contexts },
    { "many_switches", test_many_switches },
};

int main(void)
{
    int passed = 0, failed = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
#if defined(FERRY_CTX_UCONTEXT)
    printf("ctx: ucontext switch\n");
#elif defined(__x86_64__)
    printf("ctx: x86_64 assembly switch\n");
#else
    printf("ctx: aarch64 assembly switch\n");
#endif
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        int before = checks_failed;
        tests[i].fn();
        if (checks_failed == before) {
            printf("[PASS] ctx::%s\n", tests[i].name);
            passed++;
        } else {
            printf("[FAIL] ctx::%s\n", tests[i].name);
            failed++;
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
