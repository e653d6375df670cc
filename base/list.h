/* list.h - the one intrusive doubly linked list of ferry.
 *
 * A head whose `next` is NULL is empty (so {0} is valid); the first insert
 * links the sentinel.  Removing a node re-initialises it, so
 * ferry__link_linked() tells whether a node still holds a place.
 * Thread-neutral: the caller's lock or thread rule protects the list.
 */
#ifndef FERRY_LIST_H
#define FERRY_LIST_H

#include <stdbool.h>
#include <stddef.h>

#include "ferry/detail.h"

#define ferry__container_of(ptr, type, member) \
    ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

static inline void ferry__link_init(struct ferry__link *l)
{
    l->prev = l->next = NULL;
}

static inline bool ferry__link_linked(const struct ferry__link *l)
{
    return l->next != NULL;
}

static inline void ferry__list_lazy(struct ferry__link *head)
{
    if (head->next == NULL)
        head->prev = head->next = head;
}

/* An empty head, linked now (see ferry__list_empty_linked()). */
static inline void ferry__list_init_linked(struct ferry__link *head)
{
    head->prev = head->next = head;
}

static inline bool ferry__list_empty(const struct ferry__link *head)
{
    return head->next == NULL || head->next == head;
}

/* ferry__list_empty() of a head known to be linked (ferry__list_lazy()
 * done, or the target of ferry__list_move()): one comparison, for the run
 * queue, which every switch reads. */
static inline bool ferry__list_empty_linked(const struct ferry__link *head)
{
    return head->next == head;
}

/* Insert `n` before `at` (at the tail when `at` is the head). */
static inline void ferry__list_insert_before(struct ferry__link *at, struct ferry__link *n)
{
    n->next = at;
    n->prev = at->prev;
    at->prev->next = n;
    at->prev = n;
}

static inline void ferry__list_push_back(struct ferry__link *head, struct ferry__link *n)
{
    ferry__list_lazy(head);
    ferry__list_insert_before(head, n);
}

static inline void ferry__list_push_front(struct ferry__link *head, struct ferry__link *n)
{
    ferry__list_lazy(head);
    ferry__list_insert_before(head->next, n);
}

static inline void ferry__list_remove(struct ferry__link *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = NULL;
}

static inline struct ferry__link *ferry__list_first(const struct ferry__link *head)
{
    return ferry__list_empty(head) ? NULL : head->next;
}

static inline struct ferry__link *ferry__list_pop_front(struct ferry__link *head)
{
    struct ferry__link *n = ferry__list_first(head);
    if (n)
        ferry__list_remove(n);
    return n;
}

/* Move every node of `from` to the (empty) head `to`; `from` ends empty. */
static inline void ferry__list_move(struct ferry__link *to, struct ferry__link *from)
{
    if (ferry__list_empty(from)) {
        to->prev = to->next = to;
        return;
    }
    to->next = from->next;
    to->prev = from->prev;
    to->next->prev = to;
    to->prev->next = to;
    from->prev = from->next = from;
}

#define ferry__list_foreach(pos, head) \
    for ((pos) = ferry__list_empty(head) ? (head) : (head)->next; (pos) != (head); \
         (pos) = (pos)->next)

/* Safe against removal of `pos`. */
#define ferry__list_foreach_safe(pos, tmp, head) \
    for ((pos) = ferry__list_empty(head) ? (head) : (head)->next, (tmp) = (pos)->next; \
         (pos) != (head); (pos) = (tmp), (tmp) = (pos)->next)

#endif /* FERRY_LIST_H */
