/* criterion/criterion.h - a small Criterion-compatible test shim.
 *
 * Criterion 2.4 does not start under ThreadSanitizer (Snaipe/Criterion#274),
 * and it counts a test as passing when LeakSanitizer, valgrind or a failing
 * .fini complain after the body has run.  The same test sources
 * compile against this header instead (tests/CMakeLists.txt puts
 * tests/shim first on the include path when FERRY_TEST_RUNNER=shim).
 *
 * What it supports: Test() and TestSuite() with .init, .fini, .timeout,
 * .signal, .exit_code, .disabled and .description; the old-style
 * cr_assert*() / cr_expect*() family, cr_assert_fail/cr_expect_fail,
 * cr_fatal/cr_fail, cr_skip_test/cr_skip and cr_log*().  Messages are
 * optional printf formats that must be string literals, as in Criterion.
 *
 * How it runs (tests/shim/criterion_shim.c): the runner's main() forks one
 * child per test; the child runs .init, the body and .fini, then exit(0).
 * cr_assert*() failing prints the message and _exit()s the child, from any
 * thread or stack (no longjmp off a task stack); cr_expect*() marks the test
 * failed and goes on.  The runner waits with the test's timeout, checks
 * .signal and .exit_code, prints one line per test and a last line
 * "N passed, N failed".  A non-zero exit status of the child that was not
 * expected (TSan's 66, LSan's 23, valgrind's --error-exitcode) fails the
 * test, and so does an assertion in .fini.
 */
#ifndef CRITERION_SHIM_CRITERION_H
#define CRITERION_SHIM_CRITERION_H

/* What real Criterion's header brings in, so that a test that forgot an
 * include builds the same way with both. */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <wchar.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CRITERION_SHIM 1

/* Options of Test() and TestSuite(); field names as in Criterion. */
struct crs_opts {
    int crs_sentinel_;          /* keeps an empty option list valid */
    void (*init)(void);         /* fixture run before the body, in the child */
    void (*fini)(void);         /* fixture run after the body, in the child */
    int signal;                 /* the test passes only if killed by this */
    int exit_code;              /* the test passes only if it exits with this */
    bool disabled;              /* not run, reported as skipped */
    const char *description;    /* ignored */
    double timeout;             /* seconds; 0: the runner's default */
    void *data;                 /* ignored */
};

/* One registered test; built by Test(), linked by its constructor. */
struct crs_test {
    const char *suite;
    const char *name;
    void (*fn)(void);
    const char *file;
    unsigned line;
    struct crs_opts opts;
    struct crs_test *next;      /* registration list, runner only */
};

/* One TestSuite() declaration: defaults for the suite's tests. */
struct crs_suite {
    const char *name;
    struct crs_opts opts;
    struct crs_suite *next;
};

void crs_register_test(struct crs_test *t);
void crs_register_suite(struct crs_suite *s);

/* Report a failed check; `fmt` starts with a dummy 'x' (see CRS_MSG). */
_Noreturn void crs_fail_abort(const char *file, unsigned line,
                              const char *expr, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void crs_fail_continue(const char *file, unsigned line,
                       const char *expr, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
_Noreturn void crs_skip(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
void crs_log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* String comparison: op is one of "==", "!=", "<", "<=", ">", ">=". */
bool crs_str_cmp(const char *a, const char *b, const char *op);

#define CRS_CAT_(a, b) a##b
#define CRS_CAT(a, b)  CRS_CAT_(a, b)

#define TestSuite(suite, ...)                                                  \
    static struct crs_suite crs_suite_##suite = {                              \
        #suite, { .crs_sentinel_ = 0, __VA_ARGS__ }, NULL };                   \
    __attribute__((constructor)) static void crs_suite_reg_##suite(void)       \
    {                                                                          \
        crs_register_suite(&crs_suite_##suite);                                \
    }                                                                          \
    struct crs_suite_semicolon_##suite

#define Test(suite, name, ...)                                                 \
    static void crs_fn_##suite##_##name(void);                                 \
    static struct crs_test crs_test_##suite##_##name = {                       \
        #suite, #name, crs_fn_##suite##_##name, __FILE__, __LINE__,            \
        { .crs_sentinel_ = 0, __VA_ARGS__ }, NULL };                           \
    __attribute__((constructor)) static void crs_reg_##suite##_##name(void)    \
    {                                                                          \
        crs_register_test(&crs_test_##suite##_##name);                         \
    }                                                                          \
    static void crs_fn_##suite##_##name(void)

/* The optional message: "x" glued to the caller's literal format. */
#define CRS_MSG(...) "x" __VA_ARGS__

#define CRS_CHECK(fail, cond, expr, ...)                                       \
    ((cond) ? (void)0 : fail(__FILE__, __LINE__, expr, CRS_MSG(__VA_ARGS__)))

#define CRS_A crs_fail_abort
#define CRS_E crs_fail_continue

/* ---- Basic -------------------------------------------------------------- */

#define cr_assert(cond, ...)     CRS_CHECK(CRS_A, (cond), #cond, __VA_ARGS__)
#define cr_expect(cond, ...)     CRS_CHECK(CRS_E, (cond), #cond, __VA_ARGS__)
#define cr_assert_not(cond, ...) CRS_CHECK(CRS_A, !(cond), "!(" #cond ")", __VA_ARGS__)
#define cr_expect_not(cond, ...) CRS_CHECK(CRS_E, !(cond), "!(" #cond ")", __VA_ARGS__)

#define cr_assert_fail(...) crs_fail_abort(__FILE__, __LINE__, "cr_assert_fail", CRS_MSG(__VA_ARGS__))
#define cr_expect_fail(...) crs_fail_continue(__FILE__, __LINE__, "cr_expect_fail", CRS_MSG(__VA_ARGS__))
#define cr_fatal(...)       crs_fail_abort(__FILE__, __LINE__, "cr_fatal", CRS_MSG(__VA_ARGS__))
#define cr_fail(...)        crs_fail_continue(__FILE__, __LINE__, "cr_fail", CRS_MSG(__VA_ARGS__))
#define cr_skip_test(...)   crs_skip(CRS_MSG(__VA_ARGS__))
#define cr_skip(...)        crs_skip(CRS_MSG(__VA_ARGS__))

/* ---- Comparisons ---------------------------------------------------------- */

#define CRS_OP(fail, op, a, b, ...)                                            \
    CRS_CHECK(fail, ((a) op (b)), "(" #a ") " #op " (" #b ")", __VA_ARGS__)

#define cr_assert_eq(a, b, ...)  CRS_OP(CRS_A, ==, a, b, __VA_ARGS__)
#define cr_expect_eq(a, b, ...)  CRS_OP(CRS_E, ==, a, b, __VA_ARGS__)
#define cr_assert_neq(a, b, ...) CRS_OP(CRS_A, !=, a, b, __VA_ARGS__)
#define cr_expect_neq(a, b, ...) CRS_OP(CRS_E, !=, a, b, __VA_ARGS__)
#define cr_assert_lt(a, b, ...)  CRS_OP(CRS_A, <, a, b, __VA_ARGS__)
#define cr_expect_lt(a, b, ...)  CRS_OP(CRS_E, <, a, b, __VA_ARGS__)
#define cr_assert_leq(a, b, ...) CRS_OP(CRS_A, <=, a, b, __VA_ARGS__)
#define cr_expect_leq(a, b, ...) CRS_OP(CRS_E, <=, a, b, __VA_ARGS__)
#define cr_assert_gt(a, b, ...)  CRS_OP(CRS_A, >, a, b, __VA_ARGS__)
#define cr_expect_gt(a, b, ...)  CRS_OP(CRS_E, >, a, b, __VA_ARGS__)
#define cr_assert_geq(a, b, ...) CRS_OP(CRS_A, >=, a, b, __VA_ARGS__)
#define cr_expect_geq(a, b, ...) CRS_OP(CRS_E, >=, a, b, __VA_ARGS__)

#define cr_assert_null(p, ...)     CRS_CHECK(CRS_A, ((p) == NULL), "(" #p ") == NULL", __VA_ARGS__)
#define cr_expect_null(p, ...)     CRS_CHECK(CRS_E, ((p) == NULL), "(" #p ") == NULL", __VA_ARGS__)
#define cr_assert_not_null(p, ...) CRS_CHECK(CRS_A, ((p) != NULL), "(" #p ") != NULL", __VA_ARGS__)
#define cr_expect_not_null(p, ...) CRS_CHECK(CRS_E, ((p) != NULL), "(" #p ") != NULL", __VA_ARGS__)

#define cr_assert_zero(v, ...)     CRS_CHECK(CRS_A, ((v) == 0), "(" #v ") == 0", __VA_ARGS__)
#define cr_expect_zero(v, ...)     CRS_CHECK(CRS_E, ((v) == 0), "(" #v ") == 0", __VA_ARGS__)
#define cr_assert_not_zero(v, ...) CRS_CHECK(CRS_A, ((v) != 0), "(" #v ") != 0", __VA_ARGS__)
#define cr_expect_not_zero(v, ...) CRS_CHECK(CRS_E, ((v) != 0), "(" #v ") != 0", __VA_ARGS__)

#define CRS_FLOAT_EQ(a, b, eps) (((a) - (b)) <= (eps) && ((b) - (a)) <= (eps))
#define cr_assert_float_eq(a, b, eps, ...)  CRS_CHECK(CRS_A, CRS_FLOAT_EQ(a, b, eps), "|(" #a ") - (" #b ")| <= " #eps, __VA_ARGS__)
#define cr_expect_float_eq(a, b, eps, ...)  CRS_CHECK(CRS_E, CRS_FLOAT_EQ(a, b, eps), "|(" #a ") - (" #b ")| <= " #eps, __VA_ARGS__)
#define cr_assert_float_neq(a, b, eps, ...) CRS_CHECK(CRS_A, !CRS_FLOAT_EQ(a, b, eps), "|(" #a ") - (" #b ")| > " #eps, __VA_ARGS__)
#define cr_expect_float_neq(a, b, eps, ...) CRS_CHECK(CRS_E, !CRS_FLOAT_EQ(a, b, eps), "|(" #a ") - (" #b ")| > " #eps, __VA_ARGS__)

#define cr_assert_arr_eq(a, b, size, ...)  CRS_CHECK(CRS_A, memcmp((a), (b), (size)) == 0, "memcmp(" #a ", " #b ", " #size ") == 0", __VA_ARGS__)
#define cr_expect_arr_eq(a, b, size, ...)  CRS_CHECK(CRS_E, memcmp((a), (b), (size)) == 0, "memcmp(" #a ", " #b ", " #size ") == 0", __VA_ARGS__)
#define cr_assert_arr_neq(a, b, size, ...) CRS_CHECK(CRS_A, memcmp((a), (b), (size)) != 0, "memcmp(" #a ", " #b ", " #size ") != 0", __VA_ARGS__)
#define cr_expect_arr_neq(a, b, size, ...) CRS_CHECK(CRS_E, memcmp((a), (b), (size)) != 0, "memcmp(" #a ", " #b ", " #size ") != 0", __VA_ARGS__)

/* ---- Strings ---------------------------------------------------------------- */

#define CRS_STR(fail, op, a, b, ...)                                           \
    CRS_CHECK(fail, crs_str_cmp((a), (b), #op),                                \
              "strcmp(" #a ", " #b ") " #op " 0", __VA_ARGS__)

#define cr_assert_str_eq(a, b, ...)  CRS_STR(CRS_A, ==, a, b, __VA_ARGS__)
#define cr_expect_str_eq(a, b, ...)  CRS_STR(CRS_E, ==, a, b, __VA_ARGS__)
#define cr_assert_str_neq(a, b, ...) CRS_STR(CRS_A, !=, a, b, __VA_ARGS__)
#define cr_expect_str_neq(a, b, ...) CRS_STR(CRS_E, !=, a, b, __VA_ARGS__)
#define cr_assert_str_lt(a, b, ...)  CRS_STR(CRS_A, <, a, b, __VA_ARGS__)
#define cr_expect_str_lt(a, b, ...)  CRS_STR(CRS_E, <, a, b, __VA_ARGS__)
#define cr_assert_str_leq(a, b, ...) CRS_STR(CRS_A, <=, a, b, __VA_ARGS__)
#define cr_expect_str_leq(a, b, ...) CRS_STR(CRS_E, <=, a, b, __VA_ARGS__)
#define cr_assert_str_gt(a, b, ...)  CRS_STR(CRS_A, >, a, b, __VA_ARGS__)
#define cr_expect_str_gt(a, b, ...)  CRS_STR(CRS_E, >, a, b, __VA_ARGS__)
#define cr_assert_str_geq(a, b, ...) CRS_STR(CRS_A, >=, a, b, __VA_ARGS__)
#define cr_expect_str_geq(a, b, ...) CRS_STR(CRS_E, >=, a, b, __VA_ARGS__)

#define cr_assert_str_empty(s, ...)     CRS_CHECK(CRS_A, ((s)[0] == '\0'), "(" #s ")[0] == '\\0'", __VA_ARGS__)
#define cr_expect_str_empty(s, ...)     CRS_CHECK(CRS_E, ((s)[0] == '\0'), "(" #s ")[0] == '\\0'", __VA_ARGS__)
#define cr_assert_str_not_empty(s, ...) CRS_CHECK(CRS_A, ((s)[0] != '\0'), "(" #s ")[0] != '\\0'", __VA_ARGS__)
#define cr_expect_str_not_empty(s, ...) CRS_CHECK(CRS_E, ((s)[0] != '\0'), "(" #s ")[0] != '\\0'", __VA_ARGS__)

/* ---- Logging (criterion/logging.h) ------------------------------------------- */

enum criterion_logging_level {
    CR_LOG_INFO = 1,
    CR_LOG_WARNING,
    CR_LOG_ERROR,
};

#define cr_log(level, ...)  crs_log((level), __VA_ARGS__)
#define cr_log_info(...)    crs_log(CR_LOG_INFO, __VA_ARGS__)
#define cr_log_warn(...)    crs_log(CR_LOG_WARNING, __VA_ARGS__)
#define cr_log_error(...)   crs_log(CR_LOG_ERROR, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif /* CRITERION_SHIM_CRITERION_H */
