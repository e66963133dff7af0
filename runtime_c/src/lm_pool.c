/**
 * @file lm_pool.c
 * @brief The whole-model thread pool (colibri_lm.h, num_threads > 1): persistent workers
 *        running one job at a time on every thread, and colibri_lm_get_stats.
 *        Compiled out with COLIBRI_NO_FILESYSTEM (MCUs run the generated C).
 */
#ifndef COLIBRI_NO_FILESYSTEM

#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise (MADV_DONTNEED: glibc's posix_madvise ignores it) */

#include "lm_internal.h"

#ifndef COLIBRI_NO_THREADS
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#endif

/* ------------------------------------------------------------------------------------------ */
/* Thread pool (num_threads > 1): persistent workers, a short spin, then condition variables */

#ifndef COLIBRI_NO_THREADS
/*
 * A token step hands the pool about twenty jobs (the matrices of each layer, its experts, the LM
 * head), each a few hundred microseconds, separated by short single-threaded steps (norms,
 * routing, attention). A thread blocked in a condition variable takes tens of microseconds to
 * run again once signalled (more on a virtual machine, where an idle vCPU halts), so between
 * the jobs of a step each waiting thread (a worker for the next job, the caller for the
 * workers to finish) first spins on the job counter for up to LM_SPIN_NS, checking the clock
 * every LM_SPIN_CHECK polls (after LM_SPIN_YIELD polls each one yields the core, so that with
 * more threads than free cores the spinning does not hold back the thread still working), and
 * only then blocks on the condition variable. An idle pool (no
 * step running) therefore spins at most LM_SPIN_NS once, then sleeps: no busy waiting when
 * idle. The counters are C11 atomics so the spin may read them without the mutex; every
 * change still happens under the mutex, so the condition-variable protocol is the usual one.
 */
#define LM_SPIN_NS 200000L
#define LM_SPIN_CHECK 64
#define LM_SPIN_YIELD 1024 /* polls with PAUSE / YIELD before each poll yields the core instead */

struct lm_pool {
    colibri_lm_t *lm;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* a new job (gen changed) or stop */
    pthread_cond_t done; /* pending reached 0 */
    lm_job_fn fn;
    void *arg;
    _Atomic uint64_t gen;    /* job counter */
    _Atomic int32_t pending; /* workers still running the current job */
    _Atomic int32_t stop;    /* colibri_lm_free: workers return */
    int32_t n_workers;       /* started */
    colibri_status *status;  /* [n_threads] each thread's status of the current job */
    pthread_t *threads;      /* [n_workers] */
    void *args;              /* [n_workers] lm_worker_arg */
};

typedef struct {
    lm_pool *pool;
    int32_t tid;
} lm_worker_arg;

static void spin_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || (defined(__ARM_ARCH) && __ARM_ARCH >= 7)
    __asm__ volatile("yield");
#endif
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
}

/* A new job was posted (or the pool stops) since generation `seen`: a worker's wait. */
static int job_posted(const void *obj, uint64_t seen)
{
    const lm_pool *pool = (const lm_pool *)obj;
    return atomic_load_explicit(&pool->gen, memory_order_acquire) != seen ||
           atomic_load_explicit(&pool->stop, memory_order_relaxed) != 0;
}

/* Every worker finished the current job: the caller's wait. */
static int jobs_done(const void *obj, uint64_t seen)
{
    (void)seen;
    const lm_pool *pool = (const lm_pool *)obj;
    return atomic_load_explicit(&pool->pending, memory_order_acquire) == 0;
}

int clb_lm_spin(int (*ready)(const void *, uint64_t), const void *obj, uint64_t seen)
{
    int64_t start = -1;
    for (int32_t i = 1;; i++) {
        if (ready(obj, seen)) {
            return 1;
        }
        if (i > LM_SPIN_YIELD) {
            sched_yield(); /* more threads than free cores: let the one still working run */
        } else {
            spin_pause();
        }
        if (i % LM_SPIN_CHECK == 0) {
            const int64_t t = now_ns();
            if (start < 0) {
                start = t;
            } else if (t - start > LM_SPIN_NS) {
                return 0;
            }
        }
    }
}

static void *lm_worker(void *p)
{
    lm_pool *pool = ((lm_worker_arg *)p)->pool;
    const int32_t tid = ((lm_worker_arg *)p)->tid;
    uint64_t seen = 0;
    for (;;) {
        (void)clb_lm_spin(job_posted, pool, seen);
        pthread_mutex_lock(&pool->mu);
        while (!pool->stop && pool->gen == seen) {
            pthread_cond_wait(&pool->wake, &pool->mu); /* idle past the spin: blocked */
        }
        if (pool->stop) {
            break;
        }
        seen = pool->gen;
        const lm_job_fn fn = pool->fn;
        void *arg = pool->arg;
        const int32_t nt = pool->n_workers + 1;
        pthread_mutex_unlock(&pool->mu);
        const colibri_status st = fn(pool->lm, arg, tid, nt);
        pthread_mutex_lock(&pool->mu);
        pool->status[tid] = st;
        if (atomic_fetch_sub(&pool->pending, 1) == 1) {
            pthread_cond_signal(&pool->done);
        }
        pthread_mutex_unlock(&pool->mu);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

void clb_lm_pool_free(lm_pool *pool)
{
    if (pool == NULL) {
        return;
    }
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    for (int32_t i = 0; i < pool->n_workers; i++) {
        pthread_join(pool->threads[i], NULL);
    }
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->done);
    pthread_mutex_destroy(&pool->mu);
    free(pool->threads);
    free(pool->status);
    free(pool->args);
    free(pool);
}

uint64_t clb_lm_pool_bytes(int32_t n_threads)
{
    if (n_threads <= 1) {
        return 0u;
    }
    const uint64_t nw = (uint64_t)n_threads - 1u;
    return sizeof(lm_pool) + nw * (sizeof(pthread_t) + sizeof(lm_worker_arg)) +
           (nw + 1u) * sizeof(colibri_status);
}

/* n_threads - 1 workers, blocked until the first job. */
colibri_status clb_lm_pool_create(colibri_lm_t *lm, lm_pool **out)
{
    *out = NULL;
    const int32_t nw = lm->n_threads - 1;
    lm_pool *pool = (lm_pool *)calloc(1u, sizeof *pool);
    if (pool == NULL) {
        return COLIBRI_ERR_NOMEM;
    }
    pool->lm = lm;
    pool->threads = (pthread_t *)calloc((size_t)nw, sizeof *pool->threads);
    pool->status = (colibri_status *)calloc((size_t)nw + 1u, sizeof *pool->status);
    lm_worker_arg *args = (lm_worker_arg *)calloc((size_t)nw, sizeof *args);
    /* how far the set-up got: 1 mutex, 2 + the wake condition, 3 + the done condition */
    int made = 0;
    if (pool->threads != NULL && pool->status != NULL && args != NULL &&
        pthread_mutex_init(&pool->mu, NULL) == 0) {
        made = 1;
        if (pthread_cond_init(&pool->wake, NULL) == 0) {
            made = 2;
            made += pthread_cond_init(&pool->done, NULL) == 0;
        }
    }
    if (made < 3) {
        if (made == 2) {
            pthread_cond_destroy(&pool->wake);
        }
        if (made >= 1) {
            pthread_mutex_destroy(&pool->mu);
        }
        free(pool->threads);
        free(pool->status);
        free(args);
        free(pool);
        return COLIBRI_ERR_NOMEM;
    }
    pool->args = args; /* freed with the pool */
    for (int32_t i = 0; i < nw; i++) {
        args[i].pool = pool;
        args[i].tid = i + 1;
        if (pthread_create(&pool->threads[i], NULL, lm_worker, &args[i]) != 0) {
            clb_lm_pool_free(pool); /* joins the ones started */
            return COLIBRI_ERR_NOMEM;
        }
        pool->n_workers = i + 1;
    }
    *out = pool;
    return COLIBRI_OK;
}
#else
struct lm_pool {
    int32_t unused;
};

uint64_t clb_lm_pool_bytes(int32_t n_threads)
{
    (void)n_threads;
    return 0u;
}

void clb_lm_pool_free(lm_pool *pool)
{
    (void)pool;
}
#endif /* COLIBRI_NO_THREADS */

/* Run a job on every thread; the first failing status in thread order, else COLIBRI_OK. */
colibri_status clb_lm_run(colibri_lm_t *lm, lm_job_fn fn, void *arg)
{
#ifndef COLIBRI_NO_THREADS
    lm_pool *pool = lm->pool;
    if (pool != NULL) {
        pthread_mutex_lock(&pool->mu);
        pool->fn = fn;
        pool->arg = arg;
        pool->pending = pool->n_workers;
        pool->gen++;
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->mu);
        colibri_status st = fn(lm, arg, 0, pool->n_workers + 1);
        (void)clb_lm_spin(jobs_done, pool, 0);
        pthread_mutex_lock(&pool->mu);
        while (pool->pending > 0) {
            pthread_cond_wait(&pool->done, &pool->mu);
        }
        for (int32_t i = 1; i <= pool->n_workers && st == COLIBRI_OK; i++) {
            st = pool->status[i];
        }
        pthread_mutex_unlock(&pool->mu);
        return st;
    }
#endif
    return fn(lm, arg, 0, 1);
}

colibri_status colibri_lm_get_stats(const colibri_lm_t *lm, colibri_lm_stats_t *stats)
{
    if (lm == NULL || stats == NULL) {
        return COLIBRI_ERR_ARG;
    }
    *stats = lm->stats;
    return COLIBRI_OK;
}

#else
/* ISO C forbids an empty translation unit. */
typedef int colibri_lm_pool_unused;
#endif /* COLIBRI_NO_FILESYSTEM */
