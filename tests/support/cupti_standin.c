/* A stand-in libcupti for tests (tests/support/cupti_standin.py builds and drives it): the
 * calls tracer/recorder/csrc/cupti/cupti.c resolves, behaving as NVIDIA's headers document them, so
 * that every path of the C module runs without a GPU.
 *
 * - Activity happens when a test says (standin_activity: a record's bytes, laid out by
 *   tests/support/cupti_records.py from NVIDIA's struct definitions); it is kept only while its
 *   kind is enabled (for the runtime and driver kinds: the kind, or that call by its callback
 *   id), as CUPTI keeps it.
 * - A worker thread of the stand-in's own hands the records back, as CUPTI's does: it asks the
 *   client for buffers (cuptiActivityRegisterCallbacks' request callback), fills them, and
 *   completes each; with no buffer the records are dropped and counted
 *   (cuptiActivityGetNumDroppedRecords, reset when read). It delivers at a flush
 *   (cuptiActivityFlushAll waits for it), every flush period, or when a test asks; and can hand
 *   back a buffer it allocated itself, as one of another profiler's.
 * - Any call can be made to fail from its n-th use on (standin_fail), and a delivery can be
 *   held inside cuptiActivityGetNextRecord (standin_hold) while the client holds its lock.
 * Built with -DSTANDIN_MINIMAL it lacks every call cupti.c treats as optional; with
 * -DSTANDIN_BROKEN it also lacks cuptiActivityEnable. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))
enum { SUCCESS = 0, INVALID_PARAMETER = 1, MAX_LIMIT_REACHED = 12 };
enum { K_DRIVER = 4, K_RUNTIME = 5, N_KINDS = 64, N_CBIDS = 1024, QUEUE = 1 << 20 };
typedef void (*RequestFn)(uint8_t **, size_t *, size_t *);
typedef void (*CompleteFn)(void *, uint32_t, uint8_t *, size_t, size_t);

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER, done = PTHREAD_COND_INITIALIZER;
static pthread_t worker;
static int worker_running, job, jobs_done;          /* job: 1 deliver, 2 a foreign buffer */
static RequestFn request;
static CompleteFn complete;
static uint64_t (*clock_fn)(void);
static uint32_t version = 130001, period_ms;
static int kind_on[N_KINDS], call_on[2][N_CBIDS];   /* [0] driver, [1] runtime */
static size_t kind_size[N_KINDS];
static char *call_name[2][N_CBIDS];
static uint8_t queue[QUEUE];                        /* the records not handed back yet */
static size_t queued, dropped;
static struct { const char *call; int result, after, times, calls; } fails[16];
static int n_fails;
static int hold, parked, released_by;               /* 1: a test released it, 2: the watchdog */
static long counts[6];
enum { REQUESTED, COMPLETED, SUPPRESSED, FOREIGN, ON_WORKER, DELIVERIES };
static _Alignas(8) uint8_t foreign_buffer[1 << 16];

static int
failing(const char *call)
{
    int result = SUCCESS;
    pthread_mutex_lock(&m);
    for (int i = 0; i < n_fails; i++)
        if (strcmp(fails[i].call, call) == 0) {
            int use = fails[i].calls++;
            if (use >= fails[i].after && (fails[i].times == 0 ||
                                          use < fails[i].after + fails[i].times))
                result = fails[i].result;
        }
    pthread_mutex_unlock(&m);
    return result;
}

static size_t
record_size(const uint8_t *record)
{
    uint32_t kind;
    memcpy(&kind, record, sizeof kind);
    return ((kind < N_KINDS ? kind_size[kind] : 0) + 7) & ~(size_t)7;
}

/* The queued records into buffers the client hands out (or one of the stand-in's own),
 * each completed on the calling thread: the worker's. */
static void
deliver(int foreign)
{
    pthread_mutex_lock(&m);
    size_t n = queued;
    uint8_t *records = malloc(n ? n : 1);
    memcpy(records, queue, n);
    queued = 0;
    counts[DELIVERIES]++;
    pthread_mutex_unlock(&m);
    for (size_t at = 0; at < n || (foreign && at == 0);) {
        uint8_t *buffer = foreign_buffer;
        size_t size = sizeof foreign_buffer, max_records = 0;
        if (!foreign) {
            request(&buffer, &size, &max_records);
            pthread_mutex_lock(&m);
            counts[REQUESTED]++;
            pthread_mutex_unlock(&m);
        }
        if (buffer == NULL || size == 0) {           /* declined: the records are dropped */
            pthread_mutex_lock(&m);
            for (; at < n; at += record_size(records + at))
                dropped++;
            pthread_mutex_unlock(&m);
            break;
        }
        size_t valid = 0;
        while (at < n && valid + record_size(records + at) <= size) {
            memcpy(buffer + valid, records + at, record_size(records + at));
            valid += record_size(records + at);
            at += record_size(records + at);
        }
        if (valid == 0 && at < n) {                  /* a record larger than the buffer */
            pthread_mutex_lock(&m);
            dropped++;
            pthread_mutex_unlock(&m);
            at += record_size(records + at);
        }
        complete(NULL, 0, buffer, size, valid);
        pthread_mutex_lock(&m);
        counts[foreign ? FOREIGN : COMPLETED]++;
        counts[ON_WORKER] += pthread_equal(pthread_self(), worker) != 0;
        pthread_mutex_unlock(&m);
        if (foreign)
            break;
    }
    free(records);
}

static void *
work(void *unused)
{
    pthread_mutex_lock(&m);
    for (;;) {
        while (job == 0) {
            if (period_ms == 0) {
                pthread_cond_wait(&wake, &m);
                continue;
            }
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += (long)(period_ms % 1000) * 1000000L;
            until.tv_sec += period_ms / 1000 + until.tv_nsec / 1000000000L;
            until.tv_nsec %= 1000000000L;
            if (pthread_cond_timedwait(&wake, &m, &until) != 0 && queued > 0)
                job = 1;                             /* the flush period passed */
        }
        int what = job;
        pthread_mutex_unlock(&m);
        deliver(what == 2);
        pthread_mutex_lock(&m);
        job = 0;
        jobs_done++;
        pthread_cond_broadcast(&done);
    }
    return NULL;
}

/* Hands the worker a job; waits for it unless later. */
static void
post(int what, int later)
{
    pthread_mutex_lock(&m);
    while (job != 0)
        pthread_cond_wait(&done, &m);
    job = what;
    int ticket = jobs_done + 1;
    pthread_cond_signal(&wake);
    while (!later && jobs_done < ticket)
        pthread_cond_wait(&done, &m);
    pthread_mutex_unlock(&m);
}

/* ------------------------------------------------------------------ libcupti's calls */
EXPORT int cuptiGetVersion(uint32_t *v) { *v = version; return failing("cuptiGetVersion"); }

EXPORT int
cuptiActivityRegisterCallbacks(RequestFn req, CompleteFn comp)
{
    int r = failing("cuptiActivityRegisterCallbacks");
    if (r != SUCCESS)
        return r;
    if (req == NULL || comp == NULL)
        return INVALID_PARAMETER;
    pthread_mutex_lock(&m);
    request = req;
    complete = comp;
    if (!worker_running)
        worker_running = pthread_create(&worker, NULL, work, NULL) == 0;
    pthread_mutex_unlock(&m);
    return SUCCESS;
}

static int
set_kind(uint32_t kind, int on, const char *call)
{
    int r = failing(call);
    if (r == SUCCESS && kind < N_KINDS)
        kind_on[kind] = on;
    return r;
}

#ifndef STANDIN_BROKEN
EXPORT int cuptiActivityEnable(uint32_t kind) { return set_kind(kind, 1, "cuptiActivityEnable"); }
#endif
EXPORT int cuptiActivityDisable(uint32_t kind) { return set_kind(kind, 0, "cuptiActivityDisable"); }

EXPORT int
cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, void **record)
{
    int r = failing("cuptiActivityGetNextRecord");
    if (r != SUCCESS)
        return r;
    if (buffer == NULL)
        return INVALID_PARAMETER;
    uint8_t *next = *record == NULL ? buffer : (uint8_t *)*record + record_size(*record);
    if (next >= buffer + valid)
        return MAX_LIMIT_REACHED;
    pthread_mutex_lock(&m);
    if (hold) {                  /* parked: the client holds its lock meanwhile */
        hold = 0;
        parked = 1;
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 10;
        while (parked && pthread_cond_timedwait(&done, &m, &until) == 0)
            ;
        if (parked)
            released_by = 2;     /* nobody came: the watchdog */
        parked = 0;
    }
    pthread_mutex_unlock(&m);
    *record = next;
    return SUCCESS;
}

EXPORT int
cuptiActivityGetNumDroppedRecords(void *context, uint32_t stream, size_t *n)
{
    int r = failing("cuptiActivityGetNumDroppedRecords");
    if (r != SUCCESS)
        return r;
    pthread_mutex_lock(&m);
    *n = dropped;
    dropped = 0;
    pthread_mutex_unlock(&m);
    return SUCCESS;
}

EXPORT int
cuptiActivityFlushAll(uint32_t flag)
{
    int r = failing("cuptiActivityFlushAll");
    if (r == SUCCESS && worker_running)
        post(1, 0);
    return r;
}

static uint64_t
own_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec - 123456789ULL;
}

EXPORT int
cuptiGetTimestamp(uint64_t *t)
{
    *t = clock_fn != NULL ? clock_fn() : own_clock();
    return failing("cuptiGetTimestamp");
}

#ifndef STANDIN_MINIMAL
EXPORT int
cuptiActivityFlushPeriod(uint32_t ms)
{
    int r = failing("cuptiActivityFlushPeriod");
    if (r == SUCCESS) {
        pthread_mutex_lock(&m);
        period_ms = ms;
        pthread_cond_signal(&wake);
        pthread_mutex_unlock(&m);
    }
    return r;
}

EXPORT int
cuptiActivityRegisterTimestampCallback(uint64_t (*fn)(void))
{
    int r = failing("cuptiActivityRegisterTimestampCallback");
    if (r != SUCCESS)
        return r;
    if (fn == NULL)
        return INVALID_PARAMETER;
    clock_fn = fn;
    return SUCCESS;
}

EXPORT int
cuptiGetCallbackName(uint32_t domain, uint32_t cbid, const char **name)
{
    int r = failing("cuptiGetCallbackName");
    if (r != SUCCESS)
        return r;
    if ((domain != 1 && domain != 2) || cbid >= N_CBIDS || call_name[domain - 1][cbid] == NULL)
        return INVALID_PARAMETER;
    *name = call_name[domain - 1][cbid];
    return SUCCESS;
}

EXPORT int
cuptiGetResultString(int result, const char **text)
{
    *text = result == 999 ? "CUPTI_ERROR_UNKNOWN" : result == 15 ? "CUPTI_ERROR_NOT_INITIALIZED"
        : NULL;
    return *text != NULL ? SUCCESS : INVALID_PARAMETER;
}

static int
set_call(int d, uint32_t cbid, uint8_t on, const char *call)
{
    int r = failing(call);
    if (r == SUCCESS && cbid < N_CBIDS)
        call_on[d][cbid] = on;
    return r;
}

EXPORT int
cuptiActivityEnableDriverApi(uint32_t cbid, uint8_t on)
{
    return set_call(0, cbid, on, "cuptiActivityEnableDriverApi");
}

EXPORT int
cuptiActivityEnableRuntimeApi(uint32_t cbid, uint8_t on)
{
    return set_call(1, cbid, on, "cuptiActivityEnableRuntimeApi");
}
#endif

/* ------------------------------------------------------------------ what tests control */
EXPORT void
standin_reset(uint32_t v)
{
    pthread_mutex_lock(&m);
    version = v;
    clock_fn = NULL;                 /* a fresh CUPTI's: its own */
    memset(kind_on, 0, sizeof kind_on);
    memset(call_on, 0, sizeof call_on);
    memset(counts, 0, sizeof counts);
    queued = dropped = 0;
    n_fails = hold = parked = released_by = 0;
    pthread_mutex_unlock(&m);
}

EXPORT void standin_record_size(uint32_t kind, size_t size) { kind_size[kind] = size; }

EXPORT void
standin_call_name(uint32_t domain, uint32_t cbid, const char *name)
{
    free(call_name[domain - 1][cbid]);
    call_name[domain - 1][cbid] = strdup(name);
}

/* `call` returns `result` from its use number `after` on (0: the next), `times` times (0:
 * ever after). */
EXPORT void
standin_fail(const char *call, int result, int after, int times)
{
    pthread_mutex_lock(&m);
    if (n_fails < 16)
        fails[n_fails++] = (typeof(fails[0])){strdup(call), result, after, times, 0};
    pthread_mutex_unlock(&m);
}

/* Something ran on the GPU, or a call was made: its record is kept if its kind (or call) is
 * enabled. Returns whether it was; -1 for a kind whose record size was not given. */
EXPORT int
standin_activity(const uint8_t *record, size_t size)
{
    uint32_t kind, cbid;
    memcpy(&kind, record, 4);
    memcpy(&cbid, record + 4, 4);
    if (kind >= N_KINDS || kind_size[kind] == 0 || size > kind_size[kind])
        return -1;
    size_t slot = (kind_size[kind] + 7) & ~(size_t)7;
    pthread_mutex_lock(&m);
    int on = kind_on[kind] || ((kind == K_DRIVER || kind == K_RUNTIME) && cbid < N_CBIDS &&
                               call_on[kind == K_DRIVER ? 0 : 1][cbid]);
    if (on && queued + slot <= QUEUE) {
        memset(queue + queued, 0, slot);
        memcpy(queue + queued, record, size);
        queued += slot;
    }
    counts[SUPPRESSED] += !on;
    pthread_mutex_unlock(&m);
    return on;
}

EXPORT void standin_drop(size_t n) { pthread_mutex_lock(&m); dropped += n; pthread_mutex_unlock(&m); }
EXPORT void standin_deliver(int later) { post(1, later); }
EXPORT void standin_deliver_foreign(void) { post(2, 0); }
EXPORT void standin_hold(void) { pthread_mutex_lock(&m); hold = 1; pthread_mutex_unlock(&m); }
EXPORT int standin_parked(void) { pthread_mutex_lock(&m); int p = parked; pthread_mutex_unlock(&m); return p; }

EXPORT void
standin_release(void)
{
    pthread_mutex_lock(&m);
    if (parked)
        released_by = 1;
    parked = 0;
    pthread_cond_broadcast(&done);
    pthread_mutex_unlock(&m);
}

EXPORT int standin_released_by(void) { return released_by; }
EXPORT int standin_kind_on(uint32_t kind) { return kind < N_KINDS && kind_on[kind]; }
EXPORT int standin_call_on(int d, uint32_t cbid) { return cbid < N_CBIDS && call_on[d][cbid]; }
EXPORT uint32_t standin_flush_period(void) { return period_ms; }
EXPORT uint64_t standin_now(void) { return clock_fn != NULL ? clock_fn() : own_clock(); }
EXPORT long standin_count(int which) { return counts[which]; }
EXPORT uint8_t *standin_foreign_buffer(void) { return foreign_buffer; }
