/* The records half of tracer.recorder._cupti: CUPTI's records into device-file rows, on
 * the thread CUPTI hands its buffers back on (no GIL; cupti_lock). Names are interned once
 * each (kernels demangled as Kineto shows them); only the runtime and driver calls that
 * launch, copy or set are kept. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuptirecords.h"

static char *(*demangle)(const char *, char *, size_t *, int *);   /* libstdc++'s, if loaded */
static int demangle_looked_up;

CuptiCalls cupti;
pthread_mutex_t cupti_lock = PTHREAD_MUTEX_INITIALIZER;   /* everything below */
static Row *rows;
static size_t n_rows, cap_rows, max_rows = (size_t)1 << 24;
static int64_t lost_rows, dropped_records;
static size_t buffer_bytes = (size_t)4 << 20;
static char **names;                       /* interned, as shown (demangled, suffix cut) */
static uint64_t *name_hash;
static size_t n_names, cap_names, cap_hashes, names_drained;
static int64_t *slots;                     /* open addressing: name index + 1, 0 free */
static size_t n_slots;
#define N_CBIDS 4096
static int32_t api_name[2][N_CBIDS];       /* per domain and cbid: name + 2, 1 not kept, 0 unseen */

static uint64_t
hash_text(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;      /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

static int
grow(void **array, size_t *cap, size_t need, size_t item)
{
    if (need <= *cap)
        return 0;
    size_t cap2 = *cap ? *cap * 2 : 1024;
    while (cap2 < need)
        cap2 *= 2;
    void *grown = realloc(*array, cap2 * item);
    if (grown == NULL)
        return -1;
    *array = grown;
    *cap = cap2;
    return 0;
}

/* The index of a name (n bytes of text, shown as given), interned; -1 without memory. */
static int64_t
intern(const char *text, size_t n)
{
    uint64_t h = hash_text(text, n);
    if (n_slots == 0 || (n_names + 1) * 2 > n_slots) {
        size_t n2 = n_slots ? n_slots * 2 : 4096;
        int64_t *fresh = calloc(n2, sizeof(int64_t));
        if (fresh == NULL)
            return -1;
        for (size_t i = 0; i < n_names; i++) {
            size_t s = name_hash[i] & (n2 - 1);
            while (fresh[s])
                s = (s + 1) & (n2 - 1);
            fresh[s] = (int64_t)i + 1;
        }
        free(slots);
        slots = fresh;
        n_slots = n2;
    }
    size_t s = h & (n_slots - 1);
    for (; slots[s]; s = (s + 1) & (n_slots - 1)) {
        size_t i = (size_t)slots[s] - 1;
        if (name_hash[i] == h && strncmp(names[i], text, n) == 0 && names[i][n] == '\0')
            return (int64_t)i;
    }
    if (grow((void **)&names, &cap_names, n_names + 1, sizeof(char *)) < 0 ||
        grow((void **)&name_hash, &cap_hashes, n_names + 1, sizeof(uint64_t)) < 0)
        return -1;
    char *copy = strndup(text, n);
    if (copy == NULL)
        return -1;
    names[n_names] = copy;
    name_hash[n_names] = h;
    slots[s] = (int64_t)n_names + 1;
    return (int64_t)n_names++;
}

/* A kernel's name as Kineto shows it: demangled where it is a C++ name. */
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
    if (demangle != NULL && raw[0] == '_' && raw[1] == 'Z') {
        int status = -1;
        char *shown = demangle(raw, NULL, NULL, &status);
        if (shown != NULL && status == 0) {
            int64_t i = intern(shown, strlen(shown));
            free(shown);
            return i;
        }
        free(shown);
    }
    return intern(raw, strlen(raw));
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
            index = intern(name, n);
            break;
        }
    if (cached != NULL)
        *cached = (int32_t)(index + 2);
    return index;
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
        if (name < 0)
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

void
buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    void *memory = NULL;
    *size = posix_memalign(&memory, 8, buffer_bytes) == 0 ? buffer_bytes : 0;
    *buffer = memory;
    *max_records = 0;
}

void
buffer_completed(void *context, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
    (void)size;
    void *record = NULL;
    pthread_mutex_lock(&cupti_lock);
    while (valid > 0 && cupti.next_record(buffer, valid, &record) == CUPTI_OK)
        take(record);
    size_t dropped = 0;
    if (cupti.dropped(context, stream, &dropped) == CUPTI_OK)
        dropped_records += (int64_t)dropped;
    pthread_mutex_unlock(&cupti_lock);
    free(buffer);
}

void
set_buffer_bytes(size_t bytes)
{
    buffer_bytes = bytes > 65536 ? bytes : 65536;
}

Row *
take_rows(size_t *n, size_t *first, size_t *last, int64_t *lost, int64_t *dropped)
{
    Row *taken = rows;
    *n = n_rows;
    *first = names_drained;
    *last = names_drained = n_names;
    *lost = lost_rows;
    *dropped = dropped_records;
    rows = NULL;
    n_rows = cap_rows = 0;
    lost_rows = dropped_records = 0;
    return taken;
}

const char *
name_at(size_t i)
{
    return names[i];
}

