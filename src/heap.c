/* heap.c - the timer heap: an intrusive pairing heap.
 * Loop thread only.
 *
 * Nodes live in the objects that wait (tasks, ferry_timer), so arming a
 * timer allocates nothing.  Ties on the deadline fire in insertion order,
 * which keeps sleeps with equal deadlines FIFO.
 */
#include "loop_only.h"

#include <stddef.h>

#include "loop_int.h"

static bool before(const struct ferry__hnode *a, const struct ferry__hnode *b)
{
    return a->key < b->key || (a->key == b->key && a->seq < b->seq);
}

/* Meld two roots (both with next/prev NULL); returns the new root. */
static struct ferry__hnode *meld(struct ferry__hnode *a, struct ferry__hnode *b)
{
    if (before(b, a)) {
        struct ferry__hnode *t = a;
        a = b;
        b = t;
    }
    b->prev = a;
    b->next = a->child;
    if (a->child)
        a->child->prev = b;
    a->child = b;
    return a;
}

/* Two-pass pairing of a sibling list; returns one root. */
static struct ferry__hnode *merge_pairs(struct ferry__hnode *first)
{
    struct ferry__hnode *acc = NULL, *res;

    while (first) {
        struct ferry__hnode *a = first, *b = a->next;
        a->prev = NULL;
        if (!b) {
            a->next = acc;
            acc = a;
            break;
        }
        first = b->next;
        a->next = NULL;
        b->next = b->prev = NULL;
        a = meld(a, b);
        a->next = acc;
        acc = a;
    }
    if (!acc)
        return NULL;
    res = acc;
    acc = acc->next;
    res->next = NULL;
    while (acc) {
        struct ferry__hnode *nx = acc->next;
        acc->next = acc->prev = NULL;
        res = meld(res, acc);
        acc = nx;
    }
    return res;
}

void ferry__heap_insert(struct ferry__heap *h, struct ferry__hnode *n, int64_t key)
{
    n->child = n->next = n->prev = NULL;
    n->key = key;
    n->seq = h->seq++;
    n->linked = true;
    h->root = h->root ? meld(h->root, n) : n;
    h->count++;
}

void ferry__heap_remove(struct ferry__heap *h, struct ferry__hnode *n)
{
    struct ferry__hnode *sub;

    if (!n->linked)
        return;
    if (n == h->root) {
        h->root = merge_pairs(n->child);
    } else {
        if (n->prev->child == n)
            n->prev->child = n->next;
        else
            n->prev->next = n->next;
        if (n->next)
            n->next->prev = n->prev;
        sub = merge_pairs(n->child);
        if (sub)
            h->root = meld(h->root, sub);
    }
    n->child = n->next = n->prev = NULL;
    n->linked = false;
    h->count--;
}
