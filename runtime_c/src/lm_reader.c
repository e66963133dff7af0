/**
 * @file lm_reader.c
 * @brief The reader thread of a whole model's expert cache (colibri_lm.h, expert_ram_budget > 0):
 *        the experts a layer misses and those the prefetch predicts are read into their slots
 *        on this thread while the caller's thread computes what is resident; a use of an
 *        expert still being read reads its remaining chunks alongside, then waits (lm_cache.c).
 *        Without threads (COLIBRI_NO_THREADS) the functions do nothing and every read is
 *        inline.
 *        Compiled out with COLIBRI_NO_FILESYSTEM (MCUs run the generated C).
 */
#ifndef COLIBRI_NO_FILESYSTEM

#define _POSIX_C_SOURCE 200809L

#include "lm_internal.h"

#ifndef COLIBRI_NO_THREADS
#include <pthread.h>
#include <stdatomic.h>
#endif

#ifndef COLIBRI_NO_THREADS
/* A queued slot's read is split in chunks (lm_cache.chunk bytes of a part, lm_slot.n_chunks). The
 * reader takes the oldest queued read's next chunk, reads it without the mutex, and records it;
 * a thread that waits for a slot (clb_lm_reader_reap) takes that slot's chunks as well, so a
 * read the caller needs now runs on both cores, and the caller never waits for more than the
 * chunks the reader holds. The thread that records a read's last chunk checks its CRC-32s
 * (combined from the chunks') and sets the slot READY or FAILED. A read of one chunk a part
 * whose parts lie together in the file (lm_slot.whole: experts of a chunk or less, e.g.
 * stdlib-small-s1's 38 KB int8) is taken whole by one thread and read with one system call
 * instead of one per part, each with its mutex round.
 * Both waits spin before they block (clb_lm_spin, as the thread pool's): the reader for a new
 * read (`posted`) and a caller for a slot another thread is reading (`finished`). A thread
 * blocked in a condition variable takes tens of microseconds to run again once signalled (more
 * on a virtual machine, whose idle vCPU halts), as long as a small model's whole token step
 * (stdlib-small-s1: about 22 us resident); without the spin a prefetch cost more than the miss
 * it saved. Every change is still made under the mutex; the counters are atomics only so that
 * the spins may read them without it. */
struct lm_reader {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t job, done;
    colibri_lm_t *lm;
    uint64_t seq;              /* reads queued so far: lm_slot.seq, the reader's order */
    uint64_t avail;            /* chunks of queued reads that no thread has taken */
    _Atomic uint64_t posted;   /* chunks ever queued (the reader's spin) */
    _Atomic uint64_t finished; /* reads ever finished (a waiting caller's spin) */
    _Atomic int stop;
    int blocked; /* the reader waits in `job` (under the mutex) */
};

/* A chunk was queued since `seen` (or the reader stops): the reader's spin. */
static int read_posted(const void *obj, uint64_t seen)
{
    const lm_reader *r = (const lm_reader *)obj;
    return atomic_load_explicit(&r->posted, memory_order_acquire) != seen ||
           atomic_load_explicit(&r->stop, memory_order_relaxed) != 0;
}

/* A read finished since `seen`: a caller's spin for its slot. */
static int read_finished(const void *obj, uint64_t seen)
{
    const lm_reader *r = (const lm_reader *)obj;
    return atomic_load_explicit(&r->finished, memory_order_acquire) != seen;
}

/* Under the mutex: released, a spin until ready(r, the counter as it was now), taken back; 1
 * if it came true, 0 when the spin ran out of time (the caller then blocks). */
static int spin_unlocked(lm_reader *r, int (*ready)(const void *, uint64_t),
                         const _Atomic uint64_t *counter)
{
    const uint64_t seen = atomic_load_explicit(counter, memory_order_relaxed);
    pthread_mutex_unlock(&r->mu);
    const int got = clb_lm_spin(ready, r, seen);
    pthread_mutex_lock(&r->mu);
    return got;
}

_Static_assert(sizeof(lm_reader) <= LM_READER_BYTES, "LM_READER_BYTES below sizeof(lm_reader)");

/* Under the mutex: the oldest queued slot with a chunk no thread has taken (avail > 0). */
static uint32_t oldest_read(const lm_cache *c)
{
    uint32_t best = c->n_slots;
    for (uint32_t s = 0; s < c->n_slots; s++) {
        const lm_slot *sl = &c->slots[s];
        if (sl->state == LM_SLOT_LOADING && sl->next < sl->n_chunks &&
            (best == c->n_slots || sl->seq < c->slots[best].seq)) {
            best = s;
        }
    }
    return best;
}

/* Under the mutex (released while reading): slot s's next chunk taken, read and recorded; the
 * last one's thread checks the read and wakes the waiting threads. */
static void read_chunk(lm_reader *r, lm_slot *sl)
{
    const uint32_t i = sl->next;
    const uint32_t take = sl->whole ? sl->n_chunks : 1u; /* whole: every chunk, from 0 */
    sl->next += take;
    r->avail -= take;
    pthread_mutex_unlock(&r->mu);
    colibri_status st = COLIBRI_OK;
    if (sl->whole) {
        st = clb_lm_slot_read_whole(r->lm, sl); /* its chunks' CRC-32s in sl->crcs */
    } else {
        uint32_t crc = 0;
        st = clb_lm_chunk_read(r->lm, sl, i, &crc);
        sl->crcs[i] = crc; /* this chunk's alone; the mutex orders it before the check */
    }
    pthread_mutex_lock(&r->mu);
    sl->err = sl->err == COLIBRI_OK ? st : sl->err;
    sl->left -= take;
    if (sl->left > 0u) {
        return;
    }
    colibri_status got = sl->err;
    pthread_mutex_unlock(&r->mu); /* every chunk recorded: the slot is this thread's to check */
    got = got == COLIBRI_OK ? clb_lm_slot_verify(r->lm, sl) : got;
    pthread_mutex_lock(&r->mu);
    sl->state = got == COLIBRI_OK ? LM_SLOT_READY : LM_SLOT_FAILED;
    sl->got = got;
    atomic_fetch_add_explicit(&r->finished, 1u, memory_order_release);
    pthread_cond_broadcast(&r->done);
}

static void *reader_main(void *arg)
{
    lm_reader *r = (lm_reader *)arg;
    lm_cache *c = r->lm->cache;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        /* idle: spin until a spin runs out of time, then block. A read posted while spinning
         * may have been taken by the caller meanwhile (clb_lm_reader_reap): spin again then,
         * or the next post would pay the wake-up. */
        int spin = 1;
        while (!r->stop && r->avail == 0u) {
            if (spin) {
                spin = spin_unlocked(r, read_posted, &r->posted);
            } else {
                r->blocked = 1;
                pthread_cond_wait(&r->job, &r->mu);
                r->blocked = 0;
            }
        }
        if (r->stop) {
            break;
        }
        const uint32_t s = oldest_read(c);
        if (s == c->n_slots) {
            r->avail = 0u; /* not reached: avail counts the untaken chunks */
            continue;
        }
        read_chunk(r, &c->slots[s]);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* The reader thread (with a budget); none (reads inline) when the system will not give one. */
colibri_status clb_lm_reader_start(colibri_lm_t *lm)
{
    lm_cache *c = lm->cache;
    lm_reader *r = (lm_reader *)calloc(1u, sizeof *r);
    if (r == NULL) {
        return COLIBRI_ERR_NOMEM;
    }
    r->lm = lm;
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
        free(r);
        return COLIBRI_OK; /* no thread: the misses and the prefetch read inline */
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
    free(r);
    c->reader = NULL;
}

/* Hand slot s (assigned, its bytes not read) to the reader. A reader blocked in its wait is
 * woken only with `wake`: on a virtual machine the wake-up (a futex call and an interrupt to
 * the other vCPU) cost the caller more than reading a small expert itself. */
void clb_lm_reader_queue(lm_cache *c, uint32_t s, int wake)
{
    lm_reader *r = c->reader;
    lm_slot *sl = &c->slots[s];
    const uint32_t n = clb_lm_slot_chunks(c, sl);
    const int32_t whole = clb_lm_slot_whole(c, sl);
    pthread_mutex_lock(&r->mu);
    sl->whole = whole;
    sl->state = n > 0u ? LM_SLOT_LOADING : LM_SLOT_READY;
    sl->got = COLIBRI_OK;
    sl->err = COLIBRI_OK;
    sl->n_chunks = n;
    sl->next = 0;
    sl->left = n;
    sl->seq = r->seq++;
    sl->qepoch = c->epoch;
    r->avail += n;
    atomic_fetch_add_explicit(&r->posted, n, memory_order_release);
    if (wake || !r->blocked) {
        pthread_cond_signal(&r->job);
    }
    pthread_mutex_unlock(&r->mu);
    sl->queued = 1;
}

/* Slot s's queued read dropped when no thread has taken a chunk of it (its slot is about to
 * hold another expert: lm_cache.c, slot_settle); 1 if dropped. */
int clb_lm_reader_cancel(lm_cache *c, uint32_t s)
{
    lm_reader *r = c->reader;
    lm_slot *sl = &c->slots[s];
    if (!sl->queued) {
        return 0;
    }
    pthread_mutex_lock(&r->mu);
    const int drop = sl->state == LM_SLOT_LOADING && sl->next == 0u;
    if (drop) {
        r->avail -= sl->n_chunks;
        sl->next = sl->n_chunks;
        sl->left = 0u;
        sl->state = LM_SLOT_READY;
    }
    pthread_mutex_unlock(&r->mu);
    sl->queued = drop ? 0 : sl->queued;
    return drop;
}

/* One chunk of slot s's queued read that no thread has taken, read on this thread: 1, or 0
 * when there is none (not queued, or every chunk taken). */
int clb_lm_reader_help(lm_cache *c, uint32_t s)
{
    lm_reader *r = c->reader;
    lm_slot *sl = &c->slots[s];
    if (!sl->queued) {
        return 0;
    }
    pthread_mutex_lock(&r->mu);
    const int take = sl->state == LM_SLOT_LOADING && sl->next < sl->n_chunks;
    if (take) {
        read_chunk(r, sl);
    }
    pthread_mutex_unlock(&r->mu);
    return take;
}

/* Slot s's queued read seen finished (with `wait`: this thread reads its chunks no thread has
 * taken, then waits for the others): queued cleared, a failed read's slot freed; its status
 * (COLIBRI_OK while still loading without `wait`). Returns 1 in *busy when it is still
 * loading. */
colibri_status clb_lm_reader_reap(lm_cache *c, uint32_t s, int wait, int *busy)
{
    lm_reader *r = c->reader;
    lm_slot *sl = &c->slots[s];
    *busy = 0;
    if (!sl->queued) {
        return COLIBRI_OK;
    }
    pthread_mutex_lock(&r->mu);
    int spin = 1; /* until a spin runs out of time */
    while (wait && sl->state == LM_SLOT_LOADING) {
        if (sl->next < sl->n_chunks) {
            read_chunk(r, sl);
        } else if (spin) { /* every chunk taken: spin while the reads finish (this one's too) */
            spin = spin_unlocked(r, read_finished, &r->finished);
        } else {
            pthread_cond_wait(&r->done, &r->mu);
        }
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

void clb_lm_reader_queue(lm_cache *c, uint32_t s, int wake)
{
    (void)c;
    (void)s;
    (void)wake;
}

int clb_lm_reader_cancel(lm_cache *c, uint32_t s)
{
    (void)c;
    (void)s;
    return 0;
}

int clb_lm_reader_help(lm_cache *c, uint32_t s)
{
    (void)c;
    (void)s;
    return 0;
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
