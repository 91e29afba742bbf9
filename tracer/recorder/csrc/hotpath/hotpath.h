/* tracer.recorder._hotpath: the recorder's hot path in C: the common path of Session.on_op
 * (onop.c), the stack capture's walk, the shape signature's key and memory recording's storage
 * table (storagetable.c, storagetable.h).
 *
 * Each is a base class whose Python twin (recorder/op_path.py: on_op,
 * recorder/attribution/stacks.py: _PyStackWalk, recorder/attribution/shapes.py: _PyShapeKeys)
 * does the same, step for step, on the same Python containers; the subclass in
 * Python (Session, StackInterner, ShapeSignatures) owns everything off the hot path: collectives,
 * classifying an op or a code object, making a node, interning a stack's or a signature's text. These files only replace
 * interpreted bytecode with C on the paths every recorded op takes; they keep no state of their own
 * beyond the Python objects it shares with its subclass, so the two implementations agree by
 * construction and tests/integration/test_hotpath.py holds them to it.
 *
 * Built by setup.py as an optional extension for CPython >= 3.11 (PyFrame_GetLasti); without it
 * (no compiler, another Python, PARATRACE_PURE_PYTHON=1) the Python twins run.
 */
#ifndef PARATRACE_HOTPATH_H
#define PARATRACE_HOTPATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>
#include <stdint.h>

#if PY_VERSION_HEX < 0x030B0000
#error "tracer.recorder._hotpath needs CPython >= 3.11 (PyFrame_GetLasti)"
#endif

#define INTERNAL 0    /* tracer/recorder/attribution/stacks.py's kinds: INTERNAL, LIBRARY, USER */
#define RESUMABLE 4   /* a code kind's flag: a generator's or coroutine's */

/* Attribute and method names, interned once (module.c). */
extern PyObject *str_classify, *str_new_node, *str_sid, *str_root, *str_dtype, *str_shape,
    *str_id_of_new, *str_applied_at, *str_phase_hint, *str_current,
    *str_sequence_nr, *str_thread, *str_flusher, *str_flush, *str_recorder_failed;

/* A small open-addressing table from (pointer, integer) to a value, holding a reference to one
   object per entry so that its key cannot be freed and its address reused while it is there. It
   only caches answers of the Python tables (which never change an entry once made), so the hot
   path does not build a Python int or tuple to ask them. */
typedef struct {
    const void *key;          /* NULL: an empty slot */
    Py_ssize_t key2;
    void *value;
    PyObject *owned;
} Slot;

typedef struct {
    Slot *slots;
    size_t mask, used;
} PtrMap;

Slot *map_find(PtrMap *map, const void *key, Py_ssize_t key2);
int map_add(PtrMap *map, const void *key, Py_ssize_t key2, void *value, PyObject *owned);
void map_clear(PtrMap *map);
int map_traverse(PtrMap *map, visitproc visit, void *arg);

/* StackWalk: StackInterner.capture (stackwalk.c; its tables and helpers: walk_tables.c) */
typedef struct {
    PyObject_HEAD
    PyObject *kind_of_code;   /* id(code) -> (kind, resumable, code) */
    PyObject *siblings;       /* (parent node, id(code)) -> {f_lasti: node} */
    PyObject *node_sid;       /* node -> stack id, -1 until an op is issued there */
    PyObject *path;           /* [frame, f_lasti, node, {f_lasti: node}, parent], outermost first */
    PyObject *path_pos;       /* frame -> index in path */
    PyObject *last_start;     /* the frame the last capture started from, or None */
    PyObject *last_entry;     /* its path entry, or None */
    Py_ssize_t last_lasti;
    Py_ssize_t last_sid;
    PtrMap codes;             /* code -> kind | resumable << 2 (kind_of_code's answers) */
    PtrMap lastis;            /* (code, parent node) -> {f_lasti: node} (siblings' answers) */
} StackWalk;

int walk_traverse(StackWalk *self, visitproc visit, void *arg);
int walk_clear(StackWalk *self);
void walk_dealloc(StackWalk *self);
int walk_ready(StackWalk *self);
int code_bits(StackWalk *self, PyCodeObject *code);
int frame_bits(StackWalk *self, PyFrameObject *frame);
PyObject *sibling_table(StackWalk *self, PyCodeObject *code, Py_ssize_t parent);
Py_ssize_t node_sid(StackWalk *self, Py_ssize_t node);
Py_ssize_t child_node(StackWalk *self, PyObject *lastis, PyObject *parent, PyFrameObject *frame,
                      PyObject *lasti);
Py_ssize_t move_entry(StackWalk *self, PyObject *entry, PyFrameObject *frame, int lasti);
int drop_after(StackWalk *self, Py_ssize_t at);
int reset_path(StackWalk *self);
void set_last(StackWalk *self, PyObject *start, PyObject *entry, Py_ssize_t lasti,
              Py_ssize_t sid);

PyObject *walk_capture(StackWalk *self, PyObject *frame);

extern PyTypeObject StackWalkType;   /* stackwalk.c */
extern PyTypeObject ShapeKeysType;   /* shapekeys.c */
PyObject *shape_keys_id_of(PyObject *self, PyObject *ops_args);   /* a ShapeKeys' id_of */

/* tracer/vocab/labels.py's phases and recorder/op_path.py's bounds (a test holds them equal) */
#define PHASE_OTHER 0
#define PHASE_FORWARD 1
#define PHASE_BACKWARD 2
#define PHASE_RECOMPUTE 3
#define PHASE_GRAD_SYNC 4
#define PHASE_OPTIMIZER 5
#define MAX_QUEUE 200000
#define MAX_NODES (1 << 18)
#define ROW_FIELDS 12          /* tracer/recorder/rows.py's RECORD: twelve little-endian int64 */

/* SessionState: the base of recorder.session.Session (sessiontypes.c); on_op's C path (onop.c) */
typedef struct {
    PyObject_HEAD
    char passthrough, device_wanted, pg_seen, record_stacks, record_shapes;
    int open_ranges, recompute, in_optimizer;
    long long step_index, last_seq, last_event_ns;
    PyObject *specs;          /* id(op overload) -> (op id, comm, special, call, overload) */
    PyObject *queue, *push;   /* the flusher's deque and its append */
    PyObject *threads;        /* thread ident -> thread number */
    PyObject *fwd_of_node, *fwd_prev;   /* autograd node sequence number -> origin */
    PyObject *funcol;         /* functional collectives pending (comm.py) */
    PyObject *futures;        /* c10d works' futures not yet seen done (comm.py) */
    PyObject *modules, *annotations, *stacks, *signatures, *rules;
    PyObject *torch_state;    /* (current node, grad enabled, graph task id, sequence number) */
    PyObject *memory_table;   /* memory recording's StorageTable, or NULL/None: off */
    PtrMap entries;           /* op overload -> its entry of specs (held) */
} SessionState;

int session_is_ready(SessionState *s);   /* on_op can take the C path */
int session_failed(SessionState *s);     /* the recorder failed: passthrough (sessiontypes.c) */
PyObject *session_on_op(SessionState *s, PyObject *func, PyObject *args, PyObject *kwargs,
                        int *handled);
long long now_ns(void);

extern PyTypeObject SessionStateType, OpDispatchType;   /* sessiontypes.c */

/* memory recording's storage table (storagetable.c; recorder/memory/storage_table.py its twin) */
extern PyTypeObject StorageTableType, StorageRefType;
int storage_table_ready(void);      /* the types and names, once (module.c) */
int storage_table_outputs(PyObject *table, PyObject *func, PyObject *out, long long t0,
                          long long thread, int comm);
int storage_table_node_runs(PyObject *table, PyObject *node, unsigned long long nseq);
PyObject *hot_now(PyObject *module, PyObject *unused);
int add_onop_constants(PyObject *module);

#endif
