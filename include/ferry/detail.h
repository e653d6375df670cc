/* ferry/detail.h - types that public structs embed.  Private: their fields
 * are ferry's business; they are here only so that primitives can live in
 * the caller's storage (static, on a task's stack, inside a struct) and be
 * zero-initialised.
 */
#ifndef FERRY_DETAIL_H
#define FERRY_DETAIL_H

/* An intrusive doubly linked list node, or a list head.  A head whose
 * `next` is NULL is an empty list, so all-zero storage is valid. */
struct ferry__link {
    struct ferry__link *prev;
    struct ferry__link *next;
};

/* A queue of waiting tasks: the one wait mechanism of every primitive. */
struct ferry__waitq {
    struct ferry__link head;   /* of struct ferry__waiter, FIFO */
};

#endif /* FERRY_DETAIL_H */
