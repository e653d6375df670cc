/* uring_nr.h - the system call numbers of io_uring_setup, io_uring_enter
 * and io_uring_register, for test programs built against C library
 * headers older than io_uring.
 *
 * The three calls were added after the system call tables of all ABIs
 * were unified, so they have one number everywhere.  Where <sys/syscall.h>
 * has them, its numbers stand.
 */
#ifndef FERRY_URING_NR_H
#define FERRY_URING_NR_H

#include <sys/syscall.h>

#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425
#endif
#ifndef __NR_io_uring_enter
#define __NR_io_uring_enter 426
#endif
#ifndef __NR_io_uring_register
#define __NR_io_uring_register 427
#endif

#endif /* FERRY_URING_NR_H */
