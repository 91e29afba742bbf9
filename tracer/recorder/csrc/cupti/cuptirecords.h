/* What the two halves of tracer.recorder._cupti share (cupti.c: the Python module;
 * cuptirecords.c: the records into rows): CUPTI's record layouts, their stable prefixes (see
 * the NOTE in cupti.c), the rows of tracer.files.device_format they become, libcupti's calls. */
#ifndef PARATRACE_CUPTIRECORDS_H
#define PARATRACE_CUPTIRECORDS_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define PACKED __attribute__((__packed__)) __attribute__((aligned(8)))
typedef struct PACKED {
    uint32_t kind;
    uint8_t cache_config, shared_memory_config;
    uint16_t registers_per_thread;
    uint32_t cache_requested, cache_executed;
    uint64_t start, end, completed;
    uint32_t device, context, stream;
    int32_t grid[3], block[3], static_shared, dynamic_shared;
    uint32_t local_per_thread, local_total, correlation;
    int64_t grid_id;
    const char *name;
} KernelRecord;
typedef struct PACKED {
    uint32_t kind;
    uint8_t copy_kind, src_kind, dst_kind, flags;
    uint64_t bytes, start, end;
    uint32_t device, context, stream, correlation;
} MemcpyRecord;
typedef struct PACKED {
    uint32_t kind, value;
    uint64_t bytes, start, end;
    uint32_t device, context, stream, correlation;
    uint16_t flags, memory_kind;
} MemsetRecord;
typedef struct PACKED {
    uint32_t kind, cbid;
    uint64_t start, end;
    uint32_t process, thread, correlation, return_value;
} ApiRecord;

enum { K_MEMCPY = 1, K_MEMSET = 2, K_DRIVER = 4, K_RUNTIME = 5, K_CONCURRENT_KERNEL = 10 };
enum { DOMAIN_DRIVER = 1, DOMAIN_RUNTIME = 2 };
enum { CUPTI_OK = 0, CUPTI_END_OF_BUFFER = 12, FLUSH_FORCED = 1 };
/* device_format.KINDS */
enum { ROW_KERNEL = 0, ROW_MEMCPY = 1, ROW_MEMSET = 2, ROW_RUNTIME = 3, ROW_DRIVER = 4 };

/* The CUPTI API versions (cuptiGetVersion's) whose headers tests/integration/
 * test_cupti_layout.py compared with what this module reads (docs/gpu.md says how): CUDA 12.6
 * (24), 12.8 (26), 12.9 (27, 28), 13.0 (130000, 130001). Any other: Kineto's windows record.
 * CUPTI 13.2 (130202) adds a per-kind selection of a record's fields (cuptiActivityEnable_v2),
 * which can change a record's layout: not accepted before it is tested. */
#define TESTED_VERSIONS {24, 26, 27, 28, 130000, 130001}

typedef struct { int64_t kind, name, start, end, device, stream, corr, tid, nbytes; } Row;

typedef void (*RequestFn)(uint8_t **, size_t *, size_t *);
typedef void (*CompleteFn)(void *, uint32_t, uint8_t *, size_t, size_t);
typedef struct {
    int (*get_version)(uint32_t *);
    int (*enable)(uint32_t);
    int (*disable)(uint32_t);
    int (*register_callbacks)(RequestFn, CompleteFn);
    int (*next_record)(uint8_t *, size_t, void **);
    int (*dropped)(void *, uint32_t, size_t *);
    int (*flush_all)(uint32_t);
    int (*flush_period)(uint32_t);        /* CUPTI 11.x on; NULL before */
    int (*timestamp)(uint64_t *);
    int (*register_timestamp)(uint64_t (*)(void));   /* CUPTI 11.6 on; NULL before */
    int (*callback_name)(uint32_t, uint32_t, const char **);
    int (*result_string)(int, const char **);
    int (*enable_driver_api)(uint32_t, uint8_t);     /* one call's records; NULL before 12.x */
    int (*enable_runtime_api)(uint32_t, uint8_t);
} CuptiCalls;

extern CuptiCalls cupti;                   /* libcupti's calls, dlsym'd by load() */
extern pthread_mutex_t cupti_lock;         /* the rows, the names and what a drain takes */

/* What a drain takes (the caller frees rows): the rows made since the last one, and the rows
 * lost (memory), records CUPTI dropped and buffers not this module's since. */
typedef struct {
    Row *rows;
    size_t n;
    int64_t lost, dropped, foreign;
} Taken;

void take(const void *record);             /* one record into a row (lock held) */
void buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records);
void buffer_completed(void *context, uint32_t stream, uint8_t *buffer, size_t size,
                      size_t valid);
void set_buffer_bytes(size_t bytes);
void take_all(Taken *taken);               /* lock held */
void give_back(Taken *taken);              /* lock held: what a failed drain took */
size_t names_interned(void);               /* lock held */
const char *name_at(size_t i);             /* lock held: the array grows on CUPTI's thread */
/* The callback ids of the domain's calls kept (launches, copies, sets), up to max (lock
 * held): the calls whose records start enables one by one. */
size_t kept_calls(uint32_t domain, uint32_t *ids, size_t max);
void forget_calls(void);                   /* lock held: another libcupti names them now */
size_t buffers_out(void);                  /* buffers handed to CUPTI, not back yet */
int64_t names_demangled(void);             /* __cxa_demangle calls so far (lock held) */
void *records_alloc(size_t bytes);         /* malloc, failing where a test asks */
void fail_allocations(long after);         /* tests: the allocations past the next `after`
                                              fail (-1: none) */
#endif
