/**
 * @file lm_reader.c
 * @brief The reader thread of a whole model's expert cache (colibri_lm.h, expert_ram_budget > 0
 *        with the prefetch on): the experts the prefetch predicts are read into their slots on
 *        this thread while the caller's thread computes the current layer; a use of an expert
 *        still being read waits for it (lm_cache.c). Without threads (COLIBRI_NO_THREADS) the
 *        functions do nothing and the prefetch reads inline.
 *        Compiled out with COLIBRI_NO_FILESYSTEM (MCUs run the generated C).
 */
#ifndef COLIBRI_NO_FILESYSTEM

#define _POSIX_C_SOURCE 200809L

#include "lm_internal.h"

#ifndef COLIBRI_NO_THREADS
#include <pthread.h>
#endif

#ifndef COLIBRI_NO_THREADS
struct lm_reader {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t job, done;
    colibri_lm_t *lm;
    uint32_t *queue; /* slots to read, in order; a slot is queued at most once */
    uint32_t head, tail, cap;
    int stop;
};

_Static_assert(sizeof(lm_reader) <= LM_READER_BYTES, "LM_READER_BYTES below sizeof(lm_reader)");

static void *reader_main(void *arg)
{
    lm_reader *r = (lm_reader *)arg;
    const colibri_lm_t *lm = r->lm;
    lm_slot *slots = lm->cache->slots;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && r->head == r->tail) {
            pthread_cond_wait(&r->job, &r->mu);
        }
        if (r->stop) {
            break;
        }
        lm_slot *sl = &slots[r->queue[r->head % r->cap]];
        r->head++;
        pthread_mutex_unlock(&r->mu);
        const colibri_status st = clb_lm_slot_read(lm, sl->src_layer, sl->src, sl->data);
        pthread_mutex_lock(&r->mu);
        sl->state = st == COLIBRI_OK ? LM_SLOT_READY : LM_SLOT_FAILED;
        sl->got = st;
        pthread_cond_broadcast(&r->done);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* The reader thread (with a budget and the prefetch on); none (reads inline) when the system
 * will not give one. */
colibri_status clb_lm_reader_start(colibri_lm_t *lm)
{
    lm_cache *c = lm->cache;
    lm_reader *r = (lm_reader *)calloc(1u, sizeof *r);
    uint32_t *queue = (uint32_t *)malloc((size_t)c->n_slots * sizeof *queue);
    if (r == NULL || queue == NULL) {
        free(r);
        free(queue);
        return COLIBRI_ERR_NOMEM;
    }
    r->lm = lm;
    r->queue = queue;
    r->cap = c->n_slots;
    int made = pthread_mutex_init(&r->mu, NULL) == 0;
    made += made == 1 && pthread_cond_init(&r->job, NULL) == 0;
    made += made == 2 && pthread_cond_init(&r->done, NULL) == 0;
    made += made == 3 && pthread_create(&r->thread, NULL, reader_main, r) == 0;
    if (made < 4) {
        if (made >= 3) {
            pthread_cond_destroy(&r->done);
        }
        if (made >= 2) {
            pthread_cond_destroy(&r->job);
        }
        if (made >= 1) {
            pthread_mutex_destroy(&r->mu);
        }
        free(queue);
        free(r);
        return COLIBRI_OK; /* no thread: the prefetch reads inline */
    }
    c->reader = r;
    return COLIBRI_OK;
}

void clb_lm_reader_stop(lm_cache *c)
{
    lm_reader *r = c->reader;
    if (r == NULL) {
        return;
    }
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_signal(&r->job);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
    pthread_cond_destroy(&r->done);
    pthread_cond_destroy(&r->job);
    pthread_mutex_destroy(&r->mu);
    free(r->queue);
    free(r);
    c->reader = NULL;
}

/* Hand slot s (assigned, its bytes not read) to the reader. */
void clb_lm_reader_queue(lm_cache *c, uint32_t s)
{
    lm_reader *r = c->reader;
    pthread_mutex_lock(&r->mu);
    c->slots[s].state = LM_SLOT_LOADING;
    r->queue[r->tail % r->cap] = s;
    r->tail++;
    pthread_cond_signal(&r->job);
    pthread_mutex_unlock(&r->mu);
    c->slots[s].queued = 1;
}

/* Slot s's queued read seen finished (waiting for it when `wait`): queued cleared, a failed
 * read's slot freed; its status (COLIBRI_OK while still loading without `wait`). Returns 1 in
 * *busy when it is still loading. */
colibri_status clb_lm_reader_reap(lm_cache *c, uint32_t s, int wait, int *busy)
{
    lm_reader *r = c->reader;
    lm_slot *sl = &c->slots[s];
    *busy = 0;
    if (!sl->queued) {
        return COLIBRI_OK;
    }
    pthread_mutex_lock(&r->mu);
    while (wait && sl->state == LM_SLOT_LOADING) {
        pthread_cond_wait(&r->done, &r->mu);
    }
    const int32_t state = sl->state;
    const colibri_status got = sl->got;
    pthread_mutex_unlock(&r->mu);
    if (state == LM_SLOT_LOADING) {
        *busy = 1;
        return COLIBRI_OK;
    }
    sl->queued = 0;
    if (state == LM_SLOT_FAILED) {
        clb_lm_slot_clear(c, s);
        return got;
    }
    return COLIBRI_OK;
}
#else
colibri_status clb_lm_reader_start(colibri_lm_t *lm)
{
    (void)lm;
    return COLIBRI_OK;
}

void clb_lm_reader_stop(lm_cache *c)
{
    (void)c;
}

void clb_lm_reader_queue(lm_cache *c, uint32_t s)
{
    (void)c;
    (void)s;
}

colibri_status clb_lm_reader_reap(lm_cache *c, uint32_t s, int wait, int *busy)
{
    (void)c;
    (void)s;
    (void)wait;
    *busy = 0;
    return COLIBRI_OK;
}
#endif /* COLIBRI_NO_THREADS */

#else
/* ISO C forbids an empty translation unit. */
typedef int colibri_lm_reader_unused;
#endif /* COLIBRI_NO_FILESYSTEM */
