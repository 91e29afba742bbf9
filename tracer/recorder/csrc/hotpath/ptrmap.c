/* PtrMap: the pointer-keyed caches of the stack walk (hotpath.h). */
#include "hotpath.h"

static size_t
map_hash(const void *key, Py_ssize_t key2)
{
    uint64_t h = (uint64_t)(uintptr_t)key * 0x9E3779B97F4A7C15ull;
    h ^= (uint64_t)key2 * 0xC2B2AE3D27D4EB4Full;
    return (size_t)(h ^ (h >> 31));
}

Slot *
map_find(PtrMap *map, const void *key, Py_ssize_t key2)
{
    if (map->slots == NULL)
        return NULL;
    for (size_t i = map_hash(key, key2) & map->mask;; i = (i + 1) & map->mask) {
        Slot *slot = &map->slots[i];
        if (slot->key == NULL)
            return NULL;
        if (slot->key == key && slot->key2 == key2)
            return slot;
    }
}

/* Add an entry that is not there; takes a new reference to ``owned``. */
int
map_add(PtrMap *map, const void *key, Py_ssize_t key2, void *value, PyObject *owned)
{
    if ((map->used + 1) * 2 > (map->slots ? map->mask + 1 : 0)) {
        size_t size = map->slots ? (map->mask + 1) * 2 : 256;
        Slot *slots = PyMem_Calloc(size, sizeof(Slot));
        if (slots == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = 0; map->slots && i <= map->mask; i++) {
            Slot *old = &map->slots[i];
            if (old->key == NULL)
                continue;
            size_t j = map_hash(old->key, old->key2) & (size - 1);
            while (slots[j].key != NULL)
                j = (j + 1) & (size - 1);
            slots[j] = *old;
        }
        PyMem_Free(map->slots);
        map->slots = slots;
        map->mask = size - 1;
    }
    size_t i = map_hash(key, key2) & map->mask;
    while (map->slots[i].key != NULL)
        i = (i + 1) & map->mask;
    Py_INCREF(owned);
    map->slots[i] = (Slot){key, key2, value, owned};
    map->used++;
    return 0;
}

void
map_clear(PtrMap *map)
{
    Slot *slots = map->slots;
    size_t size = slots ? map->mask + 1 : 0;
    map->slots = NULL;
    map->mask = map->used = 0;
    for (size_t i = 0; i < size; i++)
        Py_XDECREF(slots[i].owned);
    PyMem_Free(slots);
}

int
map_traverse(PtrMap *map, visitproc visit, void *arg)
{
    for (size_t i = 0; map->slots && i <= map->mask; i++)
        Py_VISIT(map->slots[i].owned);
    return 0;
}
