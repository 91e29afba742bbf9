/* The records half of tracer.recorder._cupti: CUPTI's records into device-file rows, on
 * the thread CUPTI hands its buffers back on (no GIL; cupti_lock). Names are interned once
 * each (kernels demangled as Kineto shows them, each mangled name once); only the runtime and
 * driver calls that launch, copy or set are kept. Only the buffers this module handed CUPTI are
 * read and freed: one that is not (another profiler's, whose callbacks CUPTI replaced with
 * these) is left to its owner, and counted. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuptirecords.h"

static char *(*demangle)(const char *, char *, size_t *, int *);   /* libstdc++'s, if loaded */
static int demangle_looked_up;
static int64_t demangled;

CuptiCalls cupti;
pthread_mutex_t cupti_lock = PTHREAD_MUTEX_INITIALIZER;   /* everything below but the buffers */
static Row *rows;
static size_t n_rows, cap_rows, max_rows = (size_t)1 << 24;
static int64_t lost_rows, dropped_records, foreign_buffers;
static size_t buffer_bytes = (size_t)4 << 20;

/* Interned texts: open addressing over their hashes (slot: index + 1, 0 free), each text with
 * a value (the raw kernel names: the index of the name shown). */
typedef struct {
    char **text;
    uint64_t *hash;
    int64_t *value, *slots;
    size_t n, cap, n_slots;
} Table;
static Table shown;                        /* the names, as shown (demangled, suffix cut) */
static Table mangled;                      /* a mangled kernel name -> its index in shown */
#define N_CBIDS 4096
static int32_t api_name[2][N_CBIDS];       /* per domain and cbid: name + 2, 1 not kept, 0 unseen */

static pthread_mutex_t buffers_lock = PTHREAD_MUTEX_INITIALIZER;   /* the buffers handed out */
static void **owned;
static size_t n_owned, cap_owned;

static long allocations_left = -1;         /* tests: allocations that may succeed (-1: all) */

void
fail_allocations(long after)
{
    __atomic_store_n(&allocations_left, after, __ATOMIC_SEQ_CST);
}

static int
allocation_fails(void)
{
    long left = __atomic_load_n(&allocations_left, __ATOMIC_SEQ_CST);
    while (left > 0 && !__atomic_compare_exchange_n(&allocations_left, &left, left - 1, 0,
                                                    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        ;
    return left == 0;
}

void *
records_alloc(size_t bytes)
{
    return allocation_fails() ? NULL : malloc(bytes);
}

static int
grow(void **array, size_t *cap, size_t need, size_t item)
{
    if (need <= *cap)
        return 0;
    size_t cap2 = *cap ? *cap * 2 : 1024;
    while (cap2 < need)
        cap2 *= 2;
    void *grown = allocation_fails() ? NULL : realloc(*array, cap2 * item);
    if (grown == NULL)
        return -1;
    *array = grown;
    *cap = cap2;
    return 0;
}

static uint64_t
hash_text(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;      /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

/* The index of n bytes of text in the table, added with value where absent; -1 without
 * memory. */
static int64_t
table_index(Table *t, const char *text, size_t n, int64_t value)
{
    uint64_t h = hash_text(text, n);
    if (t->n_slots == 0 || (t->n + 1) * 2 > t->n_slots) {
        size_t n2 = t->n_slots ? t->n_slots * 2 : 4096;
        int64_t *fresh = allocation_fails() ? NULL : calloc(n2, sizeof(int64_t));
        if (fresh == NULL)
            return -1;
        for (size_t i = 0; i < t->n; i++) {
            size_t s = t->hash[i] & (n2 - 1);
            while (fresh[s])
                s = (s + 1) & (n2 - 1);
            fresh[s] = (int64_t)i + 1;
        }
        free(t->slots);
        t->slots = fresh;
        t->n_slots = n2;
    }
    size_t s = h & (t->n_slots - 1);
    for (; t->slots[s]; s = (s + 1) & (t->n_slots - 1)) {
        size_t i = (size_t)t->slots[s] - 1;
        if (t->hash[i] == h && strncmp(t->text[i], text, n) == 0 && t->text[i][n] == '\0')
            return (int64_t)i;
    }
    size_t cap_hash = t->cap, cap_value = t->cap;
    if (grow((void **)&t->hash, &cap_hash, t->n + 1, sizeof(uint64_t)) < 0 ||
        grow((void **)&t->value, &cap_value, t->n + 1, sizeof(int64_t)) < 0 ||
        grow((void **)&t->text, &t->cap, t->n + 1, sizeof(char *)) < 0)
        return -1;                            /* the three grow alike: a retry finds room */
    char *copy = records_alloc(n + 1);
    if (copy == NULL)
        return -1;
    memcpy(copy, text, n);
    copy[n] = '\0';
    t->text[t->n] = copy;
    t->hash[t->n] = h;
    t->value[t->n] = value;
    t->slots[s] = (int64_t)t->n + 1;
    return (int64_t)t->n++;
}

/* The index of a name (n bytes of text, shown as given), interned; -1 without memory. */
static int64_t
intern(const char *text, size_t n)
{
    return table_index(&shown, text, n, 0);
}

/* A kernel's name as Kineto shows it: demangled where it is a C++ name, once per name (a long
 * one takes 11.7 us to demangle, and a 4 MB buffer holds 15-20k kernels). */
static int64_t
kernel_name(const char *raw)
{
    if (raw == NULL)
        raw = "(unnamed kernel)";
    if (!demangle_looked_up) {        /* torch loaded libstdc++; a global symbol, or its own */
        demangle_looked_up = 1;
        *(void **)&demangle = dlsym(RTLD_DEFAULT, "__cxa_demangle");
        void *cxx = demangle == NULL ? dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_NOLOAD) : NULL;
        if (cxx != NULL)
            *(void **)&demangle = dlsym(cxx, "__cxa_demangle");
    }
    if (demangle == NULL || raw[0] != '_' || raw[1] != 'Z')
        return intern(raw, strlen(raw));
    size_t n = strlen(raw);
    int64_t seen = table_index(&mangled, raw, n, -1);
    if (seen >= 0 && mangled.value[seen] >= 0)
        return mangled.value[seen];
    int status = -1;
    char *text = demangle(raw, NULL, NULL, &status);
    demangled++;
    int64_t i = text != NULL && status == 0 ? intern(text, strlen(text)) : intern(raw, n);
    free(text);
    if (seen >= 0)                     /* else no memory to remember it: demangled again */
        mangled.value[seen] = i;
    return i;
}

static const char *COPY_KINDS[] = {"Unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD",
                                   "DtoA", "DtoD", "HtoH", "PtoP"};
static const char *MEMORY_KINDS[] = {"Unknown", "Pageable", "Pinned", "Device", "Array",
                                     "Managed", "Device Static", "Managed Static"};
#define PICK(table, i) ((i) < sizeof(table) / sizeof(*(table)) ? (table)[i] : "Unknown")

/* The name of a runtime or driver call (its version suffix cut, as Kineto shows it), or -1
 * where the call launches nothing that is kept: only launches, copies and sets are. */
static int64_t
api_name_of(uint32_t domain, uint32_t cbid)
{
    int32_t *cached = cbid < N_CBIDS ? &api_name[domain == DOMAIN_DRIVER ? 0 : 1][cbid] : NULL;
    if (cached != NULL && *cached)
        return (int64_t)*cached - 2;
    const char *name = NULL;
    if (cupti.callback_name == NULL || cupti.callback_name(domain, cbid, &name) != CUPTI_OK ||
        name == NULL)
        name = "";
    static const char *KEPT[] = {"cudaLaunch", "cudaMemcpy", "cudaMemset", "cudaGraphLaunch",
                                 "cuLaunch", "cuMemcpy", "cuMemset", "cuGraphLaunch", NULL};
    int64_t index = -1;
    for (const char **k = KEPT; *k; k++)
        if (strncmp(name, *k, strlen(*k)) == 0) {
            size_t n = strlen(name);
            const char *v = NULL;              /* the last "_v", if digits alone follow it */
            for (const char *at = strstr(name, "_v"); at != NULL; at = strstr(at + 1, "_v"))
                v = at;
            if (v != NULL && v[2] >= '0' && v[2] <= '9' && strspn(v + 2, "0123456789") ==
                    strlen(v + 2))
                n = (size_t)(v - name);
            if ((index = intern(name, n)) < 0)
                return -2;                     /* no memory: not cached, the row is lost */
            break;
        }
    if (cached != NULL)
        *cached = (int32_t)(index + 2);
    return index;
}

void
forget_calls(void)
{
    memset(api_name, 0, sizeof api_name);
}

size_t
kept_calls(uint32_t domain, uint32_t *ids, size_t max)
{
    size_t n = 0;
    for (uint32_t cbid = 1; cbid < N_CBIDS && n < max; cbid++)
        if (api_name_of(domain, cbid) >= 0)
            ids[n++] = cbid;
    return n;
}

/* One record into a row (lock held). */
void
take(const void *record)
{
    Row row;
    uint32_t kind = ((const KernelRecord *)record)->kind;
    if (kind == K_CONCURRENT_KERNEL) {
        const KernelRecord *k = record;
        row = (Row){ROW_KERNEL, kernel_name(k->name), k->start, k->end, k->device, k->stream,
                    k->correlation, 0, 0};
    } else if (kind == K_MEMCPY) {
        const MemcpyRecord *m = record;
        char text[96];
        int n = snprintf(text, sizeof text, "Memcpy %s (%s -> %s)", PICK(COPY_KINDS, m->copy_kind),
                         PICK(MEMORY_KINDS, m->src_kind), PICK(MEMORY_KINDS, m->dst_kind));
        row = (Row){ROW_MEMCPY, intern(text, (size_t)n), m->start, m->end, m->device, m->stream,
                    m->correlation, 0, (int64_t)m->bytes};
    } else if (kind == K_MEMSET) {
        const MemsetRecord *m = record;
        char text[64];
        int n = snprintf(text, sizeof text, "Memset (%s)", PICK(MEMORY_KINDS, m->memory_kind));
        row = (Row){ROW_MEMSET, intern(text, (size_t)n), m->start, m->end, m->device, m->stream,
                    m->correlation, 0, (int64_t)m->bytes};
    } else if (kind == K_RUNTIME || kind == K_DRIVER) {
        const ApiRecord *a = record;
        int64_t name = api_name_of(kind == K_DRIVER ? DOMAIN_DRIVER : DOMAIN_RUNTIME, a->cbid);
        if (name == -1)
            return;
        row = (Row){kind == K_DRIVER ? ROW_DRIVER : ROW_RUNTIME, name, a->start, a->end, -1, -1,
                    a->correlation, a->thread, 0};
    } else {
        return;
    }
    if (row.name < 0 || n_rows >= max_rows ||
        grow((void **)&rows, &cap_rows, n_rows + 1, sizeof(Row)) < 0) {
        lost_rows++;
        return;
    }
    rows[n_rows++] = row;
}

/* CUPTI asks for a buffer (on any thread): one of buffer_bytes, remembered as this module's;
 * none (size 0: CUPTI drops records, and counts them) without memory. */
void
buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    void *memory = NULL;
    if (allocation_fails() || posix_memalign(&memory, 8, buffer_bytes) != 0)
        memory = NULL;
    pthread_mutex_lock(&buffers_lock);
    if (memory != NULL && grow((void **)&owned, &cap_owned, n_owned + 1, sizeof(void *)) == 0)
        owned[n_owned++] = memory;
    else {
        free(memory);
        memory = NULL;
    }
    pthread_mutex_unlock(&buffers_lock);
    *size = memory != NULL ? buffer_bytes : 0;
    *buffer = memory;
    *max_records = 0;
}

/* Whether the buffer is one this module handed out; it is no longer out. */
static int
returned(const uint8_t *buffer)
{
    int mine = 0;
    pthread_mutex_lock(&buffers_lock);
    for (size_t i = 0; i < n_owned && !mine; i++)
        if (owned[i] == buffer) {
            owned[i] = owned[--n_owned];
            mine = 1;
        }
    pthread_mutex_unlock(&buffers_lock);
    return mine;
}

void
buffer_completed(void *context, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
    (void)size;
    int mine = buffer != NULL && returned(buffer);
    void *record = NULL;
    size_t dropped = 0;
    pthread_mutex_lock(&cupti_lock);
    if (!mine)
        foreign_buffers += buffer != NULL;     /* its records' layout is its owner's business */
    else
        while (valid > 0 && cupti.next_record(buffer, valid, &record) == CUPTI_OK)
            take(record);
    if (cupti.dropped(context, stream, &dropped) == CUPTI_OK)
        dropped_records += (int64_t)dropped;
    pthread_mutex_unlock(&cupti_lock);
    if (mine)
        free(buffer);
}

void
set_buffer_bytes(size_t bytes)
{
    buffer_bytes = bytes > 65536 ? bytes : 65536;
}

void
take_all(Taken *taken)
{
    *taken = (Taken){rows, n_rows, lost_rows, dropped_records, foreign_buffers};
    rows = NULL;
    n_rows = cap_rows = 0;
    lost_rows = dropped_records = foreign_buffers = 0;
}

void
give_back(Taken *taken)
{
    lost_rows += taken->lost;
    dropped_records += taken->dropped;
    foreign_buffers += taken->foreign;
    if (n_rows == 0) {                          /* nothing came meanwhile: they are the rows */
        free(rows);
        rows = taken->rows;
        n_rows = cap_rows = taken->n;
    } else if (grow((void **)&rows, &cap_rows, n_rows + taken->n, sizeof(Row)) == 0) {
        memmove(rows + taken->n, rows, n_rows * sizeof(Row));
        memcpy(rows, taken->rows, taken->n * sizeof(Row));
        n_rows += taken->n;
        free(taken->rows);
    } else {
        lost_rows += (int64_t)taken->n;
        free(taken->rows);
    }
    taken->rows = NULL;
}

size_t
names_interned(void)
{
    return shown.n;
}

const char *
name_at(size_t i)
{
    return shown.text[i];
}

size_t
buffers_out(void)
{
    pthread_mutex_lock(&buffers_lock);
    size_t n = n_owned;
    pthread_mutex_unlock(&buffers_lock);
    return n;
}

int64_t
names_demangled(void)
{
    return demangled;
}
