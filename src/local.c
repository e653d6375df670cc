/* local.c - task-local values: a pointer per task and key.
 * Loop thread only.
 *
 * A key is the caller's static struct; its address names it, so keys need
 * no registry (and no lock).  A task keeps its values in a short list of
 * heap entries, most recently set first: tasks hold a few values, and a
 * get walks that list.
 */
#include "loop_only.h"

#include "loop_int.h"

struct ferry__local {
    struct ferry__local *next; /* the task's next value */
    const ferry_task_key *key; /* whose value this is */
    void *value;               /* the task's value */
};

static struct ferry__local *find(ferry_task *t, const ferry_task_key *key)
{
    for (struct ferry__local *l = t->locals; l; l = l->next)
        if (l->key == key)
            return l;
    return NULL;
}

int ferry_task_local_set(const ferry_task_key *key, void *value)
{
    struct ferry__local *l;
    ferry_task *self;
    int rc;

    if (!key)
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    l = find(self, key);
    if (!l) {
        if (!value)
            return 0;
        l = ferry__malloc(sizeof *l);
        if (!l)
            return -ENOMEM;
        l->key = key;
        l->next = self->locals;
        self->locals = l;
    }
    l->value = value;
    return 0;
}

void *ferry_task_local_get(const ferry_task_key *key)
{
    ferry_task *self = ferry__self();
    struct ferry__local *l;

    if (!key || !self)
        return NULL;
    l = find(self, key);
    return l ? l->value : NULL;
}

/* Run the destructors of a list's values and free it.  A destructor that
 * sets values again adds to the task's list, which the caller drains. */
static void free_list(struct ferry__local *l)
{
    while (l) {
        struct ferry__local *next = l->next;

        if (l->value && l->key->destructor)
            l->key->destructor(l->value);
        ferry__free(l);
        l = next;
    }
}

int ferry__locals_inherit(const ferry_task *parent, struct ferry__local **out)
{
    struct ferry__local *head = NULL, **tail = &head;

    for (struct ferry__local *l = parent->locals; l; l = l->next) {
        struct ferry__local *c;

        if (!l->key->inherit || !l->value)
            continue;
        c = ferry__malloc(sizeof *c);
        if (!c) {
            free_list(head);
            return -ENOMEM;
        }
        c->key = l->key;
        c->value = l->key->inherit(l->value);
        c->next = NULL;
        *tail = c;
        tail = &c->next;
    }
    *out = head;
    return 0;
}

int ferry__locals_put(struct ferry__local **list, const ferry_task_key *key, void *value)
{
    struct ferry__local *l;

    for (l = *list; l; l = l->next) {
        if (l->key == key) {
            /* The inherited copy is replaced: it is not the task's any more. */
            if (l->value && key->destructor)
                key->destructor(l->value);
            l->value = value;
            return 0;
        }
    }
    l = ferry__malloc(sizeof *l);
    if (!l)
        return -ENOMEM;
    l->key = key;
    l->value = value;
    l->next = *list;
    *list = l;
    return 0;
}

void *ferry__task_local_of(const ferry_task *t, const ferry_task_key *key)
{
    for (struct ferry__local *l = t->locals; l; l = l->next)
        if (l->key == key)
            return l->value;
    return NULL;
}

void ferry__locals_free(struct ferry__local *list)
{
    free_list(list);
}

void ferry__locals_end(ferry_task *t)
{
    while (t->locals) {
        struct ferry__local *l = t->locals;

        t->locals = NULL;
        free_list(l);
    }
}
