/* loop_only.h - included first by every src/ file: src/ runs on the loop's
 * thread only, so a mutex, an atomic or an eventfd here is a design error
 * that this header turns into a compile error. */
#pragma GCC poison pthread_mutex_lock pthread_mutex_unlock pthread_cond_wait pthread_cond_signal \
    pthread_create atomic_load atomic_store atomic_exchange atomic_fetch_add \
        atomic_compare_exchange_strong atomic_compare_exchange_weak eventfd
