/* The replayed caching allocator's fast path in C: the free-block lists and ``serve``'s default-settings loop, on
   allocator.py's objects; ``replay``, a point's whole process under the default settings on C structs of its own
   (its section below says how it relates to the general rules); and ``assemble``, a full model's step made from a
   short model's template as event_assembly.EventAssembler makes it (its reference), its requests packed.

   Optional: setup.py builds it when a compiler is there. allocator.py's general rules (``malloc``/``free``) are the
   reference and are always present; this loop serves the requests it can exactly as they would, and stops at the
   first one it leaves to them (a cached block does not fit and a new segment does not fit either, a key that is not
   live, anything that is not a plain request on a plain block): it returns that request's index, allocator.py runs
   that one request through the general rules, and calls this loop again from the next.

   It keeps the free blocks of one stream and pool in a ``FreeList``: an array ordered by (size, address), the order of
   BlockComparatorSize in c10/cuda/CUDACachingAllocator.cpp and of allocator.py's ``SortedBlocks``, with the same
   methods.

   Why it works on allocator.py's own objects, at their __slots__ offsets. The general rules run on the same blocks
   between two calls of this loop (a new segment, a retry, the replay's frees), and so do the replay, the snapshot and
   the tests: the blocks must be allocator.py's ``Block`` and ``AllocatorSegment``, not copies. What this loop saves
   over the general rules is Python calls; reading and writing the blocks' attributes through getattr/setattr (a
   descriptor call each, about ten a request) and making each new block by calling the class (a Python ``__init__``
   per split) would put such calls back, so it reads and writes the slots' memory directly and makes blocks with
   ``tp_alloc``, filling every slot as ``__init__`` does. That is only safe while the classes are what this file
   expects, so ``bind`` checks them before anything is read or written and refuses (TypeError, and allocator.py falls
   back to the general rules) otherwise:
   - each class is a heap class of ``object`` with ``__slots__`` and no ``__dict__``, whose slots are exactly the names
     below, each a writable object slot (T_OBJECT_EX) inside the instance, reached through the class's own member
     descriptor: so every attribute is a slot this file knows, at the offset it uses;
   - a block and a segment made here equal, slot by slot and type by type, the ones the Python classes'
     ``__init__`` make from the same arguments: so a default changed in allocator.py cannot be missed here.
   In ``serve``, every object read as a block or a segment is type-checked first (a subclass keeps the offsets), and
   a slot that holds something unexpected (not set, not a bool where allocator.py keeps one) makes the loop stop and
   leave that request to the general rules, rather than guess.

   The build fingerprint: setup.py compiles the first 16 hex digits of this file's sha256 in as
   CKPTBENCH_SOURCE_HASH (``SOURCE_HASH``); allocator.py compares it with the source beside it and does not use a
   build older than its source. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

#ifndef CKPTBENCH_SOURCE_HASH
#error "build with -DCKPTBENCH_SOURCE_HASH=\"<the first 16 hex digits of this file's sha256>\" (setup.py does)"
#endif

#ifdef Py_T_OBJECT_EX /* Python 3.12 names the member types Py_T_*; structmember.h keeps the old names until then */
#define OBJECT_SLOT Py_T_OBJECT_EX
#define SLOT_READONLY Py_READONLY
#else
#define OBJECT_SLOT T_OBJECT_EX
#define SLOT_READONLY READONLY
#endif

#define MIN_BLOCK 512LL
#define SMALL_SIZE (1LL << 20)
#define SMALL_BUFFER (2LL << 20)
#define MIN_LARGE_ALLOC (10LL << 20)
#define ROUND_LARGE (2LL << 20)
#define MAX_REQUEST (1LL << 56) /* larger requests are left to the general rules: no overflow in the rounding here */

/* -- Block and AllocatorSegment: their slots, checked by bind ---------------------------------------------------- */
enum { B_ADDR, B_SIZE, B_SEGMENT, B_MAPPED, B_ALLOCATED, B_PREV, B_NEXT, B_GC_BASE, B_REQUESTED, B_KEY, N_BLOCK_SLOTS };
static const char *const BLOCK_SLOTS[N_BLOCK_SLOTS] = {"addr", "size", "segment", "mapped", "allocated",
                                                       "prev", "next", "gc_base", "requested", "key"};
enum { S_ADDR, S_SIZE, S_STREAM, S_SMALL, S_EXPANDABLE, S_PAGE, N_SEGMENT_SLOTS };
static const char *const SEGMENT_SLOTS[N_SEGMENT_SLOTS] = {"addr", "size", "stream", "small", "expandable", "page"};

typedef struct {
    PyTypeObject *block, *segment; /* owned; NULL until bind */
    Py_ssize_t block_off[N_BLOCK_SLOTS], segment_off[N_SEGMENT_SLOTS];
} Bound;

static Bound bound = {NULL, NULL, {0}, {0}};
static PyObject *segment_alloc_str = NULL; /* "segment_alloc": the recorded action */

/* A slot's value (borrowed; NULL when it is not set). Only for objects type-checked against the bound classes. */
#define BSLOT(obj, k) (*(PyObject **)((char *)(obj) + bound.block_off[k]))
#define SSLOT(obj, k) (*(PyObject **)((char *)(obj) + bound.segment_off[k]))

static inline int is_block(PyObject *obj) { return PyObject_TypeCheck(obj, bound.block); }
static inline int is_segment(PyObject *obj) { return PyObject_TypeCheck(obj, bound.segment); }

/* Store ``value`` (a new reference: stolen) in a slot, dropping the old value. */
static void slot_steal(PyObject **slot, PyObject *value) {
    PyObject *old = *slot;
    *slot = value;
    Py_XDECREF(old);
}

static void slot_set(PyObject **slot, PyObject *value) { slot_steal(slot, Py_NewRef(value)); }

static int slot_set_ll(PyObject **slot, long long value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) return -1;
    slot_steal(slot, v);
    return 0;
}

static int slot_get_ll(PyObject *value, long long *out) {
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a Block slot is not set");
        return -1;
    }
    *out = PyLong_AsLongLong(value);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* The offsets of a class's slots, into ``off`` in the order of ``names``: -1 and TypeError unless the class is a heap
   class of object whose attributes are exactly those writable object slots, reached through its own descriptors. */
static int slot_offsets(PyTypeObject *type, const char *const *names, int n, Py_ssize_t *off) {
    const char *why = NULL;
    if (!PyType_HasFeature(type, Py_TPFLAGS_HEAPTYPE) || type->tp_base != &PyBaseObject_Type)
        why = "is not a Python class deriving from object alone";
    else if (type->tp_dictoffset != 0 || type->tp_itemsize != 0 || type->tp_alloc == NULL)
        why = "has a __dict__ or variable-sized instances (it must have __slots__ only)";
    if (why != NULL) {
        PyErr_Format(PyExc_TypeError, "_replay_native: %s %s", type->tp_name, why);
        return -1;
    }
    for (int k = 0; k < n; k++) off[k] = -1;
    int found = 0;
    for (PyMemberDef *m = type->tp_members; m != NULL && m->name != NULL; m++) {
        int k = 0;
        while (k < n && strcmp(m->name, names[k]) != 0) k++;
        if (k == n || off[k] != -1) {
            PyErr_Format(PyExc_TypeError, "_replay_native: %s has a slot %s that this build does not know",
                         type->tp_name, m->name);
            return -1;
        }
        PyObject *descr = PyDict_GetItemString(type->tp_dict, m->name); /* borrowed */
        if (m->type != OBJECT_SLOT || (m->flags & SLOT_READONLY) || m->offset < (Py_ssize_t)sizeof(PyObject) ||
            m->offset > type->tp_basicsize - (Py_ssize_t)sizeof(PyObject *) || descr == NULL ||
            !Py_IS_TYPE(descr, &PyMemberDescr_Type) || ((PyMemberDescrObject *)descr)->d_member != m) {
            PyErr_Format(PyExc_TypeError, "_replay_native: %s.%s is not a plain __slots__ member", type->tp_name,
                         m->name);
            return -1;
        }
        off[k] = m->offset;
        found++;
    }
    if (found != n) {
        PyErr_Format(PyExc_TypeError, "_replay_native: %s lacks slots this build writes (%d of %d found)",
                     type->tp_name, found, n);
        return -1;
    }
    return 0;
}

/* A new Block(addr, size, segment) as Block.__init__ makes it (mapped, free, unlinked, age 0, nothing requested). */
static PyObject *new_block(long long addr, long long size, PyObject *segment) {
    PyObject *b = bound.block->tp_alloc(bound.block, 0); /* every slot NULL: filled below before anyone sees it */
    if (b == NULL) return NULL;
    if (slot_set_ll(&BSLOT(b, B_ADDR), addr) || slot_set_ll(&BSLOT(b, B_SIZE), size) ||
        slot_set_ll(&BSLOT(b, B_GC_BASE), 0) || slot_set_ll(&BSLOT(b, B_REQUESTED), 0) ||
        slot_set_ll(&BSLOT(b, B_KEY), -1)) {
        Py_DECREF(b);
        return NULL;
    }
    slot_set(&BSLOT(b, B_SEGMENT), segment);
    slot_set(&BSLOT(b, B_MAPPED), Py_True);
    slot_set(&BSLOT(b, B_ALLOCATED), Py_False);
    slot_set(&BSLOT(b, B_PREV), Py_None);
    slot_set(&BSLOT(b, B_NEXT), Py_None);
    return b;
}

/* A new AllocatorSegment(addr, size, 0, small=small, expandable=False, page=0): one cudaMalloc on stream 0. */
static PyObject *new_segment(long long addr, long long size, int small) {
    PyObject *seg = bound.segment->tp_alloc(bound.segment, 0);
    if (seg == NULL) return NULL;
    if (slot_set_ll(&SSLOT(seg, S_ADDR), addr) || slot_set_ll(&SSLOT(seg, S_SIZE), size) ||
        slot_set_ll(&SSLOT(seg, S_STREAM), 0) || slot_set_ll(&SSLOT(seg, S_PAGE), 0)) {
        Py_DECREF(seg);
        return NULL;
    }
    slot_set(&SSLOT(seg, S_SMALL), small ? Py_True : Py_False);
    slot_set(&SSLOT(seg, S_EXPANDABLE), Py_False);
    return seg;
}

/* 0 when two objects made from the same arguments hold equal values of the same types in every slot; else -1 and
   TypeError naming the first slot that differs. */
static int same_slots(PyObject *made_here, PyObject *by_init, const Py_ssize_t *off, const char *const *names, int n) {
    for (int k = 0; k < n; k++) {
        PyObject *a = *(PyObject **)((char *)made_here + off[k]), *b = *(PyObject **)((char *)by_init + off[k]);
        int equal = a != NULL && b != NULL && Py_TYPE(a) == Py_TYPE(b) ? PyObject_RichCompareBool(a, b, Py_EQ) : 0;
        if (equal < 0) return -1;
        if (!equal) {
            PyErr_Format(PyExc_TypeError, "_replay_native: %s.__init__ sets %s otherwise than this build",
                         Py_TYPE(by_init)->tp_name, names[k]);
            return -1;
        }
    }
    return 0;
}

/* The bound classes' __init__ make what new_segment and new_block make. */
static int made_as_by_init(void) {
    const long long addr = 1LL << 40, size = 20LL << 20;
    PyObject *seg_init = NULL, *seg_here = NULL, *block_init = NULL, *block_here = NULL, *args = NULL, *kwargs = NULL;
    int result = -1;
    args = Py_BuildValue("(LLi)", addr, size, 0);
    kwargs = Py_BuildValue("{sOsOsi}", "small", Py_False, "expandable", Py_False, "page", 0);
    if (args == NULL || kwargs == NULL) goto done;
    if ((seg_init = PyObject_Call((PyObject *)bound.segment, args, kwargs)) == NULL) goto done;
    if ((seg_here = new_segment(addr, size, 0)) == NULL) goto done;
    if (same_slots(seg_here, seg_init, bound.segment_off, SEGMENT_SLOTS, N_SEGMENT_SLOTS)) goto done;
    if ((block_init = PyObject_CallFunction((PyObject *)bound.block, "LLO", addr, size, seg_init)) == NULL) goto done;
    if ((block_here = new_block(addr, size, seg_init)) == NULL) goto done;
    result = same_slots(block_here, block_init, bound.block_off, BLOCK_SLOTS, N_BLOCK_SLOTS);
done:
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    Py_XDECREF(seg_init);
    Py_XDECREF(seg_here);
    Py_XDECREF(block_init);
    Py_XDECREF(block_here);
    return result;
}

static PyObject *bind(PyObject *Py_UNUSED(module), PyObject *args) {
    PyTypeObject *block, *segment;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &block, &PyType_Type, &segment)) return NULL;
    if (segment_alloc_str == NULL && (segment_alloc_str = PyUnicode_InternFromString("segment_alloc")) == NULL)
        return NULL;
    Bound candidate = {(PyTypeObject *)Py_NewRef(block), (PyTypeObject *)Py_NewRef(segment), {0}, {0}};
    Bound before = bound;
    int bad = slot_offsets(block, BLOCK_SLOTS, N_BLOCK_SLOTS, candidate.block_off) ||
              slot_offsets(segment, SEGMENT_SLOTS, N_SEGMENT_SLOTS, candidate.segment_off);
    if (!bad) {
        bound = candidate; /* new_block and new_segment use it: try them against __init__ */
        bad = made_as_by_init();
    }
    Bound *dropped = bad ? &candidate : &before; /* refused: the earlier binding stays */
    bound = bad ? before : candidate;
    Py_XDECREF(dropped->block);
    Py_XDECREF(dropped->segment);
    if (bad) return NULL;
    Py_RETURN_NONE;
}

/* -- FreeList ----------------------------------------------------------------------------------------------------- */
typedef struct {
    long long size, addr;
    PyObject *block; /* owned */
} Entry;

typedef struct {
    PyObject_HEAD
    Entry *items;
    Py_ssize_t n, cap;
} FreeList;

static inline int entry_less(long long size, long long addr, const Entry *e) {
    return size < e->size || (size == e->size && addr < e->addr);
}

/* The first entry not below (size, addr): bisect_left. */
static Py_ssize_t lower_bound(const FreeList *fl, long long size, long long addr) {
    Py_ssize_t lo = 0, hi = fl->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) >> 1;
        const Entry *e = &fl->items[mid];
        if (e->size < size || (e->size == size && e->addr < addr))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Insert a block (steals the reference) under (size, addr). */
static int fl_insert(FreeList *fl, long long size, long long addr, PyObject *block) {
    if (fl->n == fl->cap) {
        Py_ssize_t cap = fl->cap ? fl->cap * 2 : 64;
        Entry *items = PyMem_Realloc(fl->items, (size_t)cap * sizeof(Entry));
        if (items == NULL) {
            Py_DECREF(block);
            PyErr_NoMemory();
            return -1;
        }
        fl->items = items;
        fl->cap = cap;
    }
    Py_ssize_t lo = 0, hi = fl->n; /* bisect_right, as insort */
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) >> 1;
        if (entry_less(size, addr, &fl->items[mid]))
            hi = mid;
        else
            lo = mid + 1;
    }
    memmove(&fl->items[lo + 1], &fl->items[lo], (size_t)(fl->n - lo) * sizeof(Entry));
    fl->items[lo].size = size;
    fl->items[lo].addr = addr;
    fl->items[lo].block = block;
    fl->n++;
    return 0;
}

/* Take entry ``index`` out; the caller gets its reference. */
static PyObject *fl_take(FreeList *fl, Py_ssize_t index) {
    PyObject *block = fl->items[index].block;
    memmove(&fl->items[index], &fl->items[index + 1], (size_t)(fl->n - index - 1) * sizeof(Entry));
    fl->n--;
    return block;
}

/* The index of the entry under (size, addr), or -1 with KeyError set. */
static Py_ssize_t fl_find(const FreeList *fl, long long size, long long addr) {
    Py_ssize_t i = lower_bound(fl, size, addr);
    if (i < fl->n && fl->items[i].size == size && fl->items[i].addr == addr) return i;
    PyObject *key = Py_BuildValue("(LL)", size, addr);
    if (key != NULL) {
        PyErr_SetObject(PyExc_KeyError, key);
        Py_DECREF(key);
    }
    return -1;
}

static int block_key(PyObject *block, long long *size, long long *addr) {
    if (!is_block(block)) {
        PyErr_SetString(PyExc_TypeError, "expected a Block");
        return -1;
    }
    return (slot_get_ll(BSLOT(block, B_SIZE), size) || slot_get_ll(BSLOT(block, B_ADDR), addr)) ? -1 : 0;
}

static PyObject *FreeList_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "FreeList() takes no arguments");
        return NULL;
    }
    if (bound.block == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind(Block, AllocatorSegment) first");
        return NULL;
    }
    FreeList *self = (FreeList *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->items = NULL;
        self->n = self->cap = 0;
    }
    return (PyObject *)self;
}

static int FreeList_traverse(FreeList *self, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; i < self->n; i++) Py_VISIT(self->items[i].block);
    return 0;
}

static int FreeList_clear(FreeList *self) {
    Py_ssize_t n = self->n;
    self->n = 0;
    for (Py_ssize_t i = 0; i < n; i++) Py_CLEAR(self->items[i].block);
    return 0;
}

static void FreeList_dealloc(FreeList *self) {
    PyObject_GC_UnTrack(self);
    FreeList_clear(self);
    PyMem_Free(self->items);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *FreeList_add(FreeList *self, PyObject *block) {
    long long size, addr;
    if (block_key(block, &size, &addr)) return NULL;
    if (fl_insert(self, size, addr, Py_NewRef(block))) return NULL;
    Py_RETURN_NONE;
}

static PyObject *FreeList_remove(FreeList *self, PyObject *block) {
    long long size, addr;
    if (block_key(block, &size, &addr)) return NULL;
    Py_ssize_t i = fl_find(self, size, addr);
    if (i < 0) return NULL;
    Py_DECREF(fl_take(self, i));
    Py_RETURN_NONE;
}

/* A Python index into the list (negative from its end), or -1 with IndexError (or the int's own error) set. */
static Py_ssize_t fl_index(FreeList *self, PyObject *arg) {
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred()) return -1;
    if (i < 0) i += self->n;
    if (i < 0 || i >= self->n) {
        PyErr_SetString(PyExc_IndexError, "FreeList index out of range");
        return -1;
    }
    return i;
}

static PyObject *FreeList_at(FreeList *self, PyObject *arg) {
    Py_ssize_t i = fl_index(self, arg);
    return i < 0 ? NULL : Py_NewRef(self->items[i].block);
}

static PyObject *FreeList_pop(FreeList *self, PyObject *arg) {
    Py_ssize_t i = fl_index(self, arg);
    return i < 0 ? NULL : fl_take(self, i);
}

static PyObject *FreeList_lower_bound(FreeList *self, PyObject *arg) {
    long long size = PyLong_AsLongLong(arg);
    if (size == -1 && PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(lower_bound(self, size, LLONG_MIN));
}

static Py_ssize_t FreeList_len(FreeList *self) { return self->n; }

static int FreeList_contains(FreeList *self, PyObject *block) {
    long long size, addr;
    if (block_key(block, &size, &addr)) return -1;
    Py_ssize_t i = lower_bound(self, size, addr);
    return i < self->n && self->items[i].size == size && self->items[i].addr == addr &&
           self->items[i].block == block;
}

static PyObject *FreeList_iter(FreeList *self) { /* over a copy, as SortedBlocks.__iter__ */
    PyObject *list = PyList_New(self->n);
    if (list == NULL) return NULL;
    for (Py_ssize_t i = 0; i < self->n; i++) PyList_SET_ITEM(list, i, Py_NewRef(self->items[i].block));
    PyObject *it = PyObject_GetIter(list);
    Py_DECREF(list);
    return it;
}

static PyObject *FreeList_get_by_address(FreeList *Py_UNUSED(self), void *Py_UNUSED(closure)) { Py_RETURN_FALSE; }

static PyMethodDef FreeList_methods[] = {
    {"add", (PyCFunction)FreeList_add, METH_O, "Cache a block under its (size, address)."},
    {"remove", (PyCFunction)FreeList_remove, METH_O, "Take a block out (KeyError when it is not there)."},
    {"at", (PyCFunction)FreeList_at, METH_O, "The block at an index of the (size, address) order."},
    {"pop", (PyCFunction)FreeList_pop, METH_O, "Take out the block at an index of the (size, address) order."},
    {"lower_bound", (PyCFunction)FreeList_lower_bound, METH_O,
     "Index of the smallest block of at least ``size`` bytes (len(self) when none)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef FreeList_getset[] = {
    {"by_address", (getter)FreeList_get_by_address, NULL, "Always False: ordered by (size, address).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods FreeList_as_sequence = {
    .sq_length = (lenfunc)FreeList_len,
    .sq_contains = (objobjproc)FreeList_contains,
};

static PyTypeObject FreeListType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ckptbench.estimator._replay_native.FreeList",
    .tp_doc = "Free blocks of one stream and pool in (size, address) order: SortedBlocks' methods, in C.",
    .tp_basicsize = sizeof(FreeList),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = FreeList_new,
    .tp_dealloc = (destructor)FreeList_dealloc,
    .tp_traverse = (traverseproc)FreeList_traverse,
    .tp_clear = (inquiry)FreeList_clear,
    .tp_methods = FreeList_methods,
    .tp_getset = FreeList_getset,
    .tp_as_sequence = &FreeList_as_sequence,
    .tp_iter = (getiterfunc)FreeList_iter,
};

/* -- serve -------------------------------------------------------------------------------------------------------- */

/* Whether a Block's link slot holds what the general rules keep there: None or a Block. */
static inline int is_link(PyObject *link) { return link == Py_None || (link != NULL && is_block(link)); }

/* A neighbour's state for try_merge_blocks: 1 free, 0 allocated or none; -1 when it is not None nor a Block with a
   bool ``allocated`` (and, when free, the links that merging reads), and the general rules take the request. */
static int neighbour_free(PyObject *other) {
    if (other == Py_None) return 0;
    if (other == NULL || !is_block(other)) return -1;
    PyObject *allocated = BSLOT(other, B_ALLOCATED);
    if (allocated == Py_True) return 0;
    return allocated == Py_False && is_link(BSLOT(other, B_PREV)) && is_link(BSLOT(other, B_NEXT)) ? 1 : -1;
}

/* Whether this loop frees ``block`` exactly as ``free`` would: an allocated Block of a plain segment on stream 0
   (the pools' lists serve has), whose neighbours are Blocks or None; ``small``: its pool. Else the general rules
   free it. */
static int frees_here(PyObject *block, int *small) {
    if (!is_block(block) || BSLOT(block, B_ALLOCATED) != Py_True) return 0;
    PyObject *segment = BSLOT(block, B_SEGMENT);
    if (segment == NULL || !is_segment(segment) || SSLOT(segment, S_EXPANDABLE) != Py_False) return 0;
    PyObject *stream = SSLOT(segment, S_STREAM), *pool = SSLOT(segment, S_SMALL);
    int overflow = 0;
    if (stream == NULL || !PyLong_CheckExact(stream) || PyLong_AsLongAndOverflow(stream, &overflow) != 0 || overflow)
        return 0;
    if (pool != Py_True && pool != Py_False) return 0;
    *small = pool == Py_True;
    return neighbour_free(BSLOT(block, B_PREV)) >= 0 && neighbour_free(BSLOT(block, B_NEXT)) >= 0;
}

/* Unlink a free neighbour from its list before ``block`` absorbs it (try_merge_blocks); a new reference. */
static PyObject *take_neighbour(FreeList *fl, PyObject *other, long long *size, long long *addr) {
    if (slot_get_ll(BSLOT(other, B_SIZE), size) || slot_get_ll(BSLOT(other, B_ADDR), addr)) return NULL;
    Py_ssize_t i = fl_find(fl, *size, *addr);
    return i < 0 ? NULL : fl_take(fl, i);
}

/* free -> free_block: mark free, merge with free neighbours (try_merge_blocks), cache (insert_into_blocks). */
static int free_one(PyObject *block, FreeList *fl, PyObject *age, long long *allocated) {
    long long bsize, baddr, osize, oaddr;
    if (slot_get_ll(BSLOT(block, B_SIZE), &bsize) || slot_get_ll(BSLOT(block, B_ADDR), &baddr)) return -1;
    slot_set(&BSLOT(block, B_ALLOCATED), Py_False);
    *allocated -= bsize;
    PyObject *prev = BSLOT(block, B_PREV);
    if (neighbour_free(prev) == 1) {
        PyObject *taken = take_neighbour(fl, prev, &osize, &oaddr);
        if (taken == NULL) return -1;
        PyObject *before = BSLOT(prev, B_PREV);
        baddr = oaddr;
        slot_set(&BSLOT(block, B_PREV), before); /* drops block's reference to prev; ``taken`` keeps it alive */
        if (before != Py_None) slot_set(&BSLOT(before, B_NEXT), block); /* a Block: neighbour_free checked */
        bsize += osize;
        Py_DECREF(taken);
    }
    PyObject *next = BSLOT(block, B_NEXT);
    if (neighbour_free(next) == 1) {
        PyObject *taken = take_neighbour(fl, next, &osize, &oaddr);
        if (taken == NULL) return -1;
        PyObject *after = BSLOT(next, B_NEXT);
        slot_set(&BSLOT(block, B_NEXT), after);
        if (after != Py_None) slot_set(&BSLOT(after, B_PREV), block);
        bsize += osize;
        Py_DECREF(taken);
    }
    if (slot_set_ll(&BSLOT(block, B_ADDR), baddr) || slot_set_ll(&BSLOT(block, B_SIZE), bsize)) return -1;
    slot_set(&BSLOT(block, B_GC_BASE), age);
    return fl_insert(fl, bsize, baddr, Py_NewRef(block));
}

/* The allocator's counters that serve changes, read from the Stats object when it starts and written back when it
   returns (also when a request failed). */
static const char *const COUNTER_NAMES[] = {"allocated", "peak_allocated", "reserved", "peak_reserved",
                                            "num_device_alloc"};
enum { ALLOCATED, PEAK_ALLOCATED, RESERVED, PEAK_RESERVED, NUM_DEVICE_ALLOC, N_COUNTERS };

static int read_counters(PyObject *stats, long long *c) {
    for (int k = 0; k < N_COUNTERS; k++) {
        PyObject *v = PyObject_GetAttrString(stats, COUNTER_NAMES[k]);
        if (v == NULL) return -1;
        c[k] = PyLong_AsLongLong(v);
        Py_DECREF(v);
        if (c[k] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

static int write_counters(PyObject *stats, const long long *c) {
    for (int k = 0; k < N_COUNTERS; k++) {
        PyObject *v = PyLong_FromLongLong(c[k]);
        int bad = v == NULL || PyObject_SetAttrString(stats, COUNTER_NAMES[k], v);
        Py_XDECREF(v);
        if (bad) return -1;
    }
    return 0;
}

/* What a new segment needs: the limits of _alloc_block and where the next one goes (_address). */
typedef struct {
    int on;                                  /* new segments here (else: stop at the first request needing one) */
    long long allowed, device_cap, large_segment, next_addr;
    PyObject *record;                        /* Stats.segment_events when recorded, else NULL */
} Segments;

/* One allocation (round_size, get_free_block, else get_allocation_size and alloc_block; alloc_found_block):
   1 served, 0 left to the general rules (nothing cached fits, and no new segment here), -1 error. */
static int alloc_one(PyObject *live, PyObject *key, PyObject *nbytes_obj, long long nbytes, FreeList *small_fl,
                     FreeList *large_fl, PyObject *small_age, PyObject *large_age, Segments *seg, long long *c) {
    long long size = nbytes < MIN_BLOCK ? MIN_BLOCK : (nbytes + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
    int small = size <= SMALL_SIZE;
    FreeList *fl = small ? small_fl : large_fl;
    Py_ssize_t index = lower_bound(fl, size, LLONG_MIN);
    long long bsize, baddr;
    PyObject *block;
    if (index < fl->n) { /* get_free_block: the best fit */
        PyObject *found = fl->items[index].block; /* a Block (FreeList checks): its links and segment are read below */
        if (!is_link(BSLOT(found, B_NEXT)) || BSLOT(found, B_SEGMENT) == NULL) return 0;
        bsize = fl->items[index].size;
        baddr = fl->items[index].addr;
        block = fl_take(fl, index);
    } else { /* nothing cached fits: a new segment (get_allocation_size, alloc_block), when there is room */
        if (!seg->on) return 0;
        bsize = small ? SMALL_BUFFER
                      : size < MIN_LARGE_ALLOC ? seg->large_segment : (size + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
        if ((seg->allowed >= 0 && c[RESERVED] + bsize > seg->allowed) || c[RESERVED] + bsize > seg->device_cap)
            return 0; /* the general rules: free cached segments and retry, or out of memory */
        baddr = seg->next_addr;
        PyObject *segment = new_segment(baddr, bsize, small);
        block = segment == NULL ? NULL : new_block(baddr, bsize, segment);
        Py_XDECREF(segment);
        if (block == NULL) return -1;
        if (seg->record != NULL) {
            PyObject *event = Py_BuildValue("(OLL)", segment_alloc_str, baddr, bsize);
            int bad = event == NULL || PyList_Append(seg->record, event);
            Py_XDECREF(event);
            if (bad) {
                Py_DECREF(block);
                return -1;
            }
        }
        seg->next_addr += (bsize + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
        c[RESERVED] += bsize;
        c[NUM_DEVICE_ALLOC] += 1;
        if (c[RESERVED] > c[PEAK_RESERVED]) c[PEAK_RESERVED] = c[RESERVED];
    }
    long long remaining = bsize - size;
    if (small ? remaining >= MIN_BLOCK : remaining > SMALL_SIZE) { /* should_split: the rest is cached */
        PyObject *rest = new_block(baddr + size, remaining, BSLOT(block, B_SEGMENT));
        if (rest == NULL || slot_set_ll(&BSLOT(block, B_SIZE), size)) {
            Py_XDECREF(rest);
            Py_DECREF(block);
            return -1;
        }
        PyObject *next = BSLOT(block, B_NEXT);
        slot_set(&BSLOT(rest, B_PREV), block);
        slot_set(&BSLOT(rest, B_NEXT), next);
        if (next != Py_None) slot_set(&BSLOT(next, B_PREV), rest);
        slot_set(&BSLOT(block, B_NEXT), rest);
        slot_set(&BSLOT(rest, B_GC_BASE), small ? small_age : large_age);
        bsize = size;
        if (fl_insert(fl, remaining, baddr + size, rest)) {
            Py_DECREF(block);
            return -1;
        }
    }
    slot_set(&BSLOT(block, B_ALLOCATED), Py_True);
    slot_set(&BSLOT(block, B_REQUESTED), nbytes_obj);
    c[ALLOCATED] += bsize;
    if (c[ALLOCATED] > c[PEAK_ALLOCATED]) c[PEAK_ALLOCATED] = c[ALLOCATED];
    int err = PyDict_SetItem(live, key, block);
    Py_DECREF(block);
    return err ? -1 : 1;
}

static PyObject *serve(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "serve(requests, start, live, small, large, small_age, large_age, stats, alloc_op, segments)");
        return NULL;
    }
    PyObject *requests = args[0], *live = args[2], *small_age = args[5], *large_age = args[6], *stats = args[7];
    if (bound.block == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind(Block, AllocatorSegment) first");
        return NULL;
    }
    if (!PyDict_Check(live) || !Py_IS_TYPE(args[3], &FreeListType) || !Py_IS_TYPE(args[4], &FreeListType)) {
        PyErr_SetString(PyExc_TypeError, "serve: live must be a dict, small and large FreeLists");
        return NULL;
    }
    FreeList *small_fl = (FreeList *)args[3], *large_fl = (FreeList *)args[4];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    long alloc_op = PyLong_AsLong(args[8]);
    if (PyErr_Occurred()) return NULL;
    Segments seg = {0, -1, 0, 0, -1, NULL};
    if (args[9] != Py_None) { /* (allowed or -1, device_cap, large_segment_size, next_addr, record or None) */
        PyObject *record = NULL;
        if (!PyArg_ParseTuple(args[9], "LLLLO", &seg.allowed, &seg.device_cap, &seg.large_segment, &seg.next_addr,
                              &record))
            return NULL;
        if (record != Py_None && !PyList_Check(record)) {
            PyErr_SetString(PyExc_TypeError, "serve: the segment record is a list or None");
            return NULL;
        }
        seg.on = 1;
        seg.record = record == Py_None ? NULL : record;
    }
    long long c[N_COUNTERS];
    if (read_counters(stats, c)) return NULL;
    PyObject *seq = PySequence_Fast(requests, "serve: requests must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), i = start < 0 ? 0 : start;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int failed = 0;
    for (; i < n; i++) {
        /* What is not a plain (int op, key, int bytes) request is left to the general rules (they raise for it). */
        PyObject *req = items[i];
        if (!PyTuple_CheckExact(req) || PyTuple_GET_SIZE(req) != 3) break;
        PyObject *op_obj = PyTuple_GET_ITEM(req, 0), *key = PyTuple_GET_ITEM(req, 1);
        PyObject *nbytes_obj = PyTuple_GET_ITEM(req, 2);
        if (!PyLong_CheckExact(op_obj)) break;
        int overflow = 0;
        long op = PyLong_AsLongAndOverflow(op_obj, &overflow);
        if (op == -1 && PyErr_Occurred()) {
            failed = 1;
            break;
        }
        if (overflow || op != alloc_op) { /* free: live.pop(key), then free_block */
            PyObject *block = PyDict_GetItemWithError(live, key); /* borrowed */
            int small = 0;
            if (block == NULL) {
                failed = PyErr_Occurred() != NULL;
                break; /* an unknown key: the general rules raise KeyError */
            }
            if (!frees_here(block, &small)) break;
            Py_INCREF(block);
            failed = PyDict_DelItem(live, key) ||
                     free_one(block, small ? small_fl : large_fl, small ? small_age : large_age, &c[ALLOCATED]);
            Py_DECREF(block);
            if (failed) break;
            continue;
        }
        if (!PyLong_CheckExact(nbytes_obj)) break;
        long long nbytes = PyLong_AsLongLongAndOverflow(nbytes_obj, &overflow);
        if (nbytes == -1 && PyErr_Occurred()) {
            failed = 1;
            break;
        }
        if (overflow || nbytes > MAX_REQUEST) break;
        int served = alloc_one(live, key, nbytes_obj, nbytes, small_fl, large_fl, small_age, large_age, &seg, c);
        if (served <= 0) {
            failed = served < 0;
            break;
        }
    }
    Py_DECREF(seq);
    PyObject *etype = NULL, *evalue = NULL, *etb = NULL;
    if (failed) PyErr_Fetch(&etype, &evalue, &etb);
    int bad = write_counters(stats, c);
    if (failed) {
        if (bad) PyErr_Clear();
        PyErr_Restore(etype, evalue, etb);
        return NULL;
    }
    return bad ? NULL : Py_BuildValue("(nL)", i, seg.next_addr);
}

/* One event of a micro-batch, as MicroPlan.of compares it with the same event of the last micro-batch: an
 * allocation by its size, a free by the allocation it frees (made before the step: its key; made in the step: how
 * many micro-batches ago, and which of that micro-batch's allocations). */
typedef struct {
    long long kind, a, b; /* 0: allocation (a: bytes); 1: free of a key made before the step (a: key); 2: free of
                             the b-th allocation of the micro-batch a back */
} PlanEvent;

/* micro_plan(events, starts, alloc_op) -> (keys, origin, freed, periodic_from) or None: MicroPlan.of's loop over a
 * step's events (replay.py: its pure-Python loop is the reference, tests/test_native.py compares them). None: an
 * event that is not a plain (int op, int key, int bytes) tuple, or a number beyond 64 bits: the caller runs its own
 * loop. */
static PyObject *micro_plan(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "micro_plan(events, starts, alloc_op)");
        return NULL;
    }
    long alloc_op = PyLong_AsLong(args[2]);
    if (alloc_op == -1 && PyErr_Occurred()) return NULL;
    PyObject *seq = PySequence_Fast(args[0], "micro_plan: events must be a sequence");
    if (seq == NULL) return NULL;
    PyObject *starts_seq = PySequence_Fast(args[1], "micro_plan: starts must be a sequence");
    if (starts_seq == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), ns = PySequence_Fast_GET_SIZE(starts_seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *result = NULL, *origin = NULL, *freed = NULL, *keys = NULL, *made = NULL;
    Py_ssize_t *st = NULL;
    PlanEvent *shape = NULL;
    int plain = 1;
    if (ns < 2) {
        PyErr_SetString(PyExc_ValueError, "micro_plan: starts holds at least two indices");
        goto done;
    }
    st = PyMem_Malloc((size_t)ns * sizeof(Py_ssize_t));
    if (st == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < ns; k++) {
        st[k] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(starts_seq, k));
        if (st[k] == -1 && PyErr_Occurred()) goto done;
        if (st[k] < 0 || st[k] > n || (k > 0 && st[k] < st[k - 1])) {
            PyErr_SetString(PyExc_ValueError, "micro_plan: starts must rise within the events");
            goto done;
        }
    }
    Py_ssize_t micro = ns - 1, span = st[micro] - st[0];
    shape = PyMem_Malloc((size_t)(span > 0 ? span : 1) * sizeof(PlanEvent));
    origin = PyDict_New();
    freed = PySet_New(NULL);
    keys = PyTuple_New(micro);
    if (shape == NULL || origin == NULL || freed == NULL || keys == NULL) {
        if (shape == NULL) PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t m = 0; m < micro && plain; m++) {
        made = PyList_New(0);
        if (made == NULL) goto done;
        for (Py_ssize_t i = st[m]; i < st[m + 1]; i++) {
            PyObject *ev = items[i];
            PlanEvent *out = &shape[i - st[0]];
            if (!PyTuple_CheckExact(ev) || PyTuple_GET_SIZE(ev) < 3 || !PyLong_CheckExact(PyTuple_GET_ITEM(ev, 0)) ||
                !PyLong_CheckExact(PyTuple_GET_ITEM(ev, 1)) || !PyLong_CheckExact(PyTuple_GET_ITEM(ev, 2))) {
                plain = 0;
                break;
            }
            PyObject *key = PyTuple_GET_ITEM(ev, 1);
            int op_overflow = 0, overflow = 0;
            long op = PyLong_AsLongAndOverflow(PyTuple_GET_ITEM(ev, 0), &op_overflow);
            long long keyv = PyLong_AsLongLongAndOverflow(key, &overflow);
            if (op_overflow || overflow) {
                plain = 0;
                break;
            }
            if (op == alloc_op) {
                long long nbytes = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(ev, 2), &overflow);
                if (overflow) {
                    plain = 0;
                    break;
                }
                PyObject *at = Py_BuildValue("(nn)", m, PyList_GET_SIZE(made));
                if (at == NULL) goto done;
                int err = PyDict_SetItem(origin, key, at);
                Py_DECREF(at);
                if (err || PyList_Append(made, key)) goto done;
                out->kind = 0;
                out->a = nbytes;
                out->b = 0;
            } else {
                if (PySet_Add(freed, key)) goto done;
                PyObject *at = PyDict_GetItemWithError(origin, key); /* borrowed */
                if (at == NULL) {
                    if (PyErr_Occurred()) goto done;
                    out->kind = 1;
                    out->a = keyv;
                    out->b = 0;
                } else {
                    Py_ssize_t at_m = PyLong_AsSsize_t(PyTuple_GET_ITEM(at, 0));
                    Py_ssize_t at_i = PyLong_AsSsize_t(PyTuple_GET_ITEM(at, 1));
                    out->kind = 2;
                    out->a = (long long)(m - at_m);
                    out->b = (long long)at_i;
                }
            }
        }
        if (!plain) break;
        PyObject *made_tuple = PyList_AsTuple(made);
        Py_CLEAR(made);
        if (made_tuple == NULL) goto done;
        PyTuple_SET_ITEM(keys, m, made_tuple); /* steals it */
    }
    if (!plain) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* periodic_from: the first micro-batch from which each one's events are the last one's */
    Py_ssize_t periodic = micro - 1, last_len = st[micro] - st[micro - 1];
    const PlanEvent *last = &shape[st[micro - 1] - st[0]];
    while (periodic > 0) {
        Py_ssize_t len = st[periodic] - st[periodic - 1];
        const PlanEvent *other = &shape[st[periodic - 1] - st[0]];
        if (len != last_len || (len && memcmp(other, last, (size_t)len * sizeof(PlanEvent)) != 0)) break;
        periodic--;
    }
    PyObject *frozen = PyFrozenSet_New(freed);
    if (frozen == NULL) goto done;
    result = Py_BuildValue("(OONn)", keys, origin, frozen, periodic);
done:
    Py_XDECREF(made);
    Py_XDECREF(keys);
    Py_XDECREF(origin);
    Py_XDECREF(freed);
    PyMem_Free(shape);
    PyMem_Free(st);
    Py_DECREF(starts_seq);
    Py_DECREF(seq);
    return result;
}

/* copy_program(program, start, events, own, workspaces, next_key, alloc_op, free_op, forward) -> (next_key, index):
 * event_assembly.EventAssembler._segment's copies, from ``start``: each (COPY_ALLOC, id, bytes, workspace) appends
 * (alloc_op, key, bytes) with the next key, kept in ``own[id]`` (and in ``workspaces`` when it is one); each
 * (COPY_LOCAL, id, 0, False) appends (free_op, own[id], 0); each (COPY_FORWARD, id, 0, False) appends
 * (free_op, forward[id], 0) (``forward``: the keys of the same layer's forward, or None where the segment has none).
 * It stops at the first entry of another code (a free the assembler places by its rules: event_assembly.py's loop is
 * the reference) and returns its index, or len(program) when there is none. */
#define COPY_ALLOC 0
#define COPY_LOCAL 1
#define COPY_FORWARD 3
static PyObject *copy_program(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "copy_program(program, start, events, own, workspaces, next_key, alloc_op, "
                                         "free_op, forward)");
        return NULL;
    }
    PyObject *program = args[0], *events = args[2], *own = args[3], *workspaces = args[4];
    PyObject *alloc_op = args[6], *free_op = args[7], *forward = args[8];
    if (!PyList_CheckExact(program) || !PyList_CheckExact(events) || !PyDict_CheckExact(own) ||
        !PySet_Check(workspaces) || (forward != Py_None && !PyDict_CheckExact(forward))) {
        PyErr_SetString(PyExc_TypeError, "copy_program: program and events are lists, own a dict, workspaces a set, "
                                         "forward a dict or None");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    if (i == -1 && PyErr_Occurred()) return NULL;
    long long next_key = PyLong_AsLongLong(args[5]);
    if (next_key == -1 && PyErr_Occurred()) return NULL;
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(program);
    if (i < 0) i = n;
    for (; i < n; i++) {
        PyObject *entry = PyList_GET_ITEM(program, i);
        if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 4) {
            PyErr_SetString(PyExc_TypeError, "copy_program: each entry is (code, id, bytes, workspace)");
            goto fail;
        }
        long code = PyLong_AsLong(PyTuple_GET_ITEM(entry, 0));
        if (code == -1 && PyErr_Occurred()) goto fail;
        PyObject *eid = PyTuple_GET_ITEM(entry, 1), *ev;
        if (code == COPY_ALLOC) {
            PyObject *key = PyLong_FromLongLong(next_key);
            if (key == NULL) goto fail;
            if (PyDict_SetItem(own, eid, key) < 0) {
                Py_DECREF(key);
                goto fail;
            }
            int workspace = PyObject_IsTrue(PyTuple_GET_ITEM(entry, 3));
            if (workspace < 0 || (workspace && PySet_Add(workspaces, key) < 0)) {
                Py_DECREF(key);
                goto fail;
            }
            ev = PyTuple_Pack(3, alloc_op, key, PyTuple_GET_ITEM(entry, 2));
            Py_DECREF(key);
            next_key++;
        } else if (code == COPY_LOCAL || (code == COPY_FORWARD && forward != Py_None)) {
            PyObject *key = PyDict_GetItemWithError(code == COPY_LOCAL ? own : forward, eid); /* borrowed */
            if (key == NULL) {
                if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, eid);
                goto fail;
            }
            ev = PyTuple_Pack(3, free_op, key, zero);
        } else {
            break; /* a placed free: the caller's rules */
        }
        if (ev == NULL) goto fail;
        int err = PyList_Append(events, ev);
        Py_DECREF(ev);
        if (err < 0) goto fail;
    }
    Py_DECREF(zero);
    return Py_BuildValue("(Ln)", next_key, i);
fail:
    Py_DECREF(zero);
    return NULL;
}

/* shift_events(events, start, k_before, step) -> None: event_assembly.EventAssembler._repeat's copy: appends to
 * ``events`` each (op, key, bytes) of events[start:] (as it is when called), its key moved on by ``step`` where it is at
 * least ``k_before`` (the Python comprehension there is the reference). */
static PyObject *shift_events(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "shift_events(events, start, k_before, step)");
        return NULL;
    }
    PyObject *events = args[0];
    if (!PyList_CheckExact(events)) {
        PyErr_SetString(PyExc_TypeError, "shift_events: events is a list");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    long long k_before = PyLong_AsLongLong(args[2]);
    if (k_before == -1 && PyErr_Occurred()) return NULL;
    long long step = PyLong_AsLongLong(args[3]);
    if (step == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t end = PyList_GET_SIZE(events);
    if (start < 0 || start > end) {
        PyErr_SetString(PyExc_IndexError, "shift_events: start out of range");
        return NULL;
    }
    for (Py_ssize_t i = start; i < end; i++) {
        PyObject *ev = PyList_GET_ITEM(events, i);
        if (!PyTuple_CheckExact(ev) || PyTuple_GET_SIZE(ev) != 3) {
            PyErr_SetString(PyExc_TypeError, "shift_events: each event is (op, key, bytes)");
            return NULL;
        }
        PyObject *key = PyTuple_GET_ITEM(ev, 1), *copy;
        long long k = PyLong_AsLongLong(key);
        if (k == -1 && PyErr_Occurred()) return NULL;
        if (k >= k_before) {
            PyObject *moved = PyLong_FromLongLong(k + step);
            if (moved == NULL) return NULL;
            copy = PyTuple_Pack(3, PyTuple_GET_ITEM(ev, 0), moved, PyTuple_GET_ITEM(ev, 2));
            Py_DECREF(moved);
        } else {
            copy = PyTuple_Pack(3, PyTuple_GET_ITEM(ev, 0), key, PyTuple_GET_ITEM(ev, 2));
        }
        if (copy == NULL) return NULL;
        int err = PyList_Append(events, copy);
        Py_DECREF(copy);
        if (err < 0) return NULL;
    }
    Py_RETURN_NONE;
}

/* -- assemble: a full model's step from a short model's template, on integer tables ------------------------------ */

/* assemble(tables, layer_of, micro, labels, releases, optimizer, repeat, alloc_op, free_op, opt_label) ->
 * (packed, bounds, workspaces, next_key) or None: event_assembly.EventAssembler.run (the reference, which this follows
 * step for step), on the tables ``event_assembly.native_tables`` packs once per template (int64, header below);
 * ``packed``: the step's requests as int64 (op, key, bytes) triples. A full segment's keys are its first key plus each
 * allocation's rank among its template's allocations (the copies give keys in program order), so no dictionary of
 * keys is made. ``layer_of``: the template layer of each full layer (int64); ``labels``: each full segment's label, by
 * index (``seg_index``; ``event_assembly.segment_labels``); ``releases``: (full segment, template id) pairs, by
 * segment, ids descending (the shared tensors freed at a segment's end, as ``_releases_into`` orders them);
 * ``optimizer``: the optimizer step's requests packed with keys from 0 (``_optimizer_relative``: a free's key is the
 * rank of the allocation it frees). None where the reference would raise or look up something that is not there: the
 * caller then runs the reference, which raises as it always did. */

enum { K_START, K_PRE, K_FWD, K_HEAD, K_LOGITS, K_EXIT, K_BACK, K_BWD, K_TAIL, K_ZERO, K_OTHER, N_KINDS };
enum { H_L, H_T, H_NTID, H_NEID, H_TID_OF, H_TID_META, H_PROG_INDEX, H_PROG, H_RULES, H_OUT_INDEX, H_OUT, H_CX_INDEX,
       H_CX, H_ALLOC, H_SIZE = 16 };
#define RULE_CROSSING 1 /* event_assembly's rules (_MISSING, 0, always raises: its ``error`` is set) */
#define RULE_ROLE 2
#define RULE_OTHER 3
#define COPY_PLACED 2

typedef struct {
    const long long *d;
    long long L, T, neid;
    Py_ssize_t n, micro, block, nseg;
    const long long *layer_of;
    long long *base, *done;
    int *tid;
    long long *ev; /* (op, key, bytes) triples */
    Py_ssize_t nev, cap_ev;
    long long *bd; /* (event index, segment index; -1: the optimizer step) pairs */
    Py_ssize_t nbd, cap_bd;
    long long *ws;
    Py_ssize_t nws, cap_ws;
    long long next_key;
    int nomem;
} Asm;

static int grow(long long **buf, Py_ssize_t *cap, Py_ssize_t need, Asm *a) {
    if (need <= *cap) return 0;
    Py_ssize_t cap2 = *cap ? *cap : 1024;
    while (cap2 < need) cap2 *= 2;
    long long *b = PyMem_Realloc(*buf, (size_t)cap2 * sizeof(long long));
    if (b == NULL) {
        a->nomem = 1;
        return -1;
    }
    *buf = b;
    *cap = cap2;
    return 0;
}

static int push_ev(Asm *a, long long op, long long key, long long nbytes) {
    if (grow(&a->ev, &a->cap_ev, 3 * (a->nev + 1), a) < 0) return -1;
    long long *e = a->ev + 3 * a->nev++;
    e[0] = op;
    e[1] = key;
    e[2] = nbytes;
    return 0;
}

static int push_bd(Asm *a, long long seg) {
    if (grow(&a->bd, &a->cap_bd, 2 * (a->nbd + 1), a) < 0) return -1;
    a->bd[2 * a->nbd] = a->nev;
    a->bd[2 * a->nbd + 1] = seg;
    a->nbd++;
    return 0;
}

static int push_ws(Asm *a, long long key) {
    if (grow(&a->ws, &a->cap_ws, a->nws + 1, a) < 0) return -1;
    a->ws[a->nws++] = key;
    return 0;
}

/* The template id of (kind, template layer or -1, template micro-batch or -1), or -1 (no such segment: no events). */
static long long tid_of(const Asm *a, long long kind, long long t, long long tm) {
    if (kind < 0 || kind >= N_KINDS || t < -1 || t >= a->L || tm < -1 || tm >= a->T) return -1;
    return a->d[a->d[H_TID_OF] + (kind * (a->L + 1) + (t + 1)) * (a->T + 1) + (tm + 1)];
}

/* The index of full segment (kind, layer or -1, micro-batch or -1), or -1 where the step has none. */
static Py_ssize_t seg_index(const Asm *a, long long kind, long long j, long long m) {
    if (kind == K_START || kind == K_ZERO) return (j == -1 && m == -1) ? (kind == K_START ? 0 : 1) : -1;
    if (m < 0 || m >= a->micro) return -1;
    Py_ssize_t at = 2 + (Py_ssize_t)m * a->block;
    if (kind == K_FWD || kind == K_BWD) {
        if (j < 0 || j >= a->n) return -1;
        return at + 6 + (kind == K_BWD ? a->n : 0) + (Py_ssize_t)j;
    }
    if (j != -1) return -1;
    switch (kind) {
    case K_PRE: return at;
    case K_HEAD: return at + 1;
    case K_LOGITS: return at + 2;
    case K_EXIT: return at + 3;
    case K_BACK: return at + 4;
    case K_TAIL: return at + 5;
    default: return -1;
    }
}

/* keys[(kind, j, m)][eid]: the key a full segment gave template allocation ``eid``; -1 where the reference has none
 * (the segment not made yet, made from another template, or the allocation not reached yet). */
static long long key_of(const Asm *a, long long kind, long long j, long long m, long long eid) {
    Py_ssize_t s = seg_index(a, kind, j, m);
    if (s < 0 || a->tid[s] < 0 || eid < 0 || eid >= a->neid) return -1;
    const long long *al = a->d + a->d[H_ALLOC] + 2 * eid;
    if (al[0] != a->tid[s] || al[1] < 0 || al[1] >= a->done[s]) return -1;
    return a->base[s] + al[1];
}

static int free_key(Asm *a, long long key, long long free_op) { return key < 0 ? -1 : push_ev(a, free_op, key, 0); }

/* EventAssembler._micros_at: up to ``cap`` micro-batches into ``out`` (-1 for None); their count. */
static Py_ssize_t micros_at(const Asm *a, long long lm, long long tm, long long made, long long *out, Py_ssize_t cap) {
    if (made == -1) {
        out[0] = -1;
        return 1;
    }
    if (lm != -1 && tm != -1) {
        out[0] = lm - (tm - made);
        return 1;
    }
    if (made < a->T - 1) {
        out[0] = made;
        return 1;
    }
    if (a->micro - made > cap) return -1;
    Py_ssize_t k = 0;
    for (long long m = made; m < a->micro; m++) out[k++] = m;
    return k;
}

static int output_free(Asm *a, long long kind, long long j, long long micro, long long index, long long free_op) {
    if (j != -1 && (j < 0 || j >= a->n)) return -1;
    long long tm = micro == -1 ? -1 : (micro < a->T - 1 ? micro : a->T - 1);
    long long t = tid_of(a, kind, j == -1 ? -1 : a->layer_of[j], tm);
    if (t < 0) return -1;
    const long long *oi = a->d + a->d[H_OUT_INDEX] + 2 * t;
    if (index < 0 || index >= oi[1]) return -1;
    long long eid = a->d[a->d[H_OUT] + oi[0] + index];
    return free_key(a, key_of(a, kind, j, micro, eid), free_op);
}

static int role_free(Asm *a, long long lk, long long lj, long long yk, long long index, long long micro,
                     long long free_op) {
    if (yk == K_FWD) {
        long long below = lj != -1 ? lj - 1 : (long long)a->n - 1;
        return below < 0 ? 0 : output_free(a, K_FWD, below, micro, index, free_op);
    }
    long long above = lj != -1 ? lj + 1 : 0;
    if (lk == K_BWD && above >= a->n) return output_free(a, K_BACK, -1, micro, index, free_op);
    return output_free(a, K_BWD, above, micro, index, free_op);
}

/* One full segment, as EventAssembler._segment: its program, the frees its rules place, its releases. */
static int segment(Asm *a, Py_ssize_t s, long long kind, long long j, long long lm, long long t,
                   const long long *rel, Py_ssize_t nrel, long long alloc_op, long long free_op) {
    if (push_bd(a, s) < 0) return -1;
    a->base[s] = a->next_key;
    a->tid[s] = t < 0 ? -1 : (int)t; /* no template segment: no events, no keys (a lookup into it fails, as there) */
    a->done[s] = 0;
    static const long long none_index[2] = {0, 0};
    const long long *meta = t < 0 ? NULL : a->d + a->d[H_TID_META] + 3 * t;
    long long tt = meta ? meta[1] : -1, tm = meta ? meta[2] : -1;
    const long long *pi = t < 0 ? none_index : a->d + a->d[H_PROG_INDEX] + 2 * t;
    const long long *prog = a->d + a->d[H_PROG] + 4 * pi[0];
    int expanded = 0;
    long long ms[256];
    for (long long i = 0; i < pi[1]; i++) {
        const long long *e = prog + 4 * i;
        switch (e[0]) {
        case COPY_ALLOC: {
            long long key = a->next_key++;
            a->done[s]++;
            if (push_ev(a, alloc_op, key, e[1]) < 0) return -1;
            if (e[2] && push_ws(a, key) < 0) return -1;
            break;
        }
        case COPY_LOCAL:
            if (e[1] < 0 || e[1] >= a->done[s]) return -1;
            if (push_ev(a, free_op, a->base[s] + e[1], 0) < 0) return -1;
            break;
        case COPY_FORWARD:
            if (free_key(a, key_of(a, K_FWD, j, lm, e[2]), free_op) < 0) return -1;
            break;
        case COPY_PLACED: {
            const long long *r = a->d + a->d[H_RULES] + 7 * e[1];
            long long how = r[0], yk = r[1], yt = r[2], ym = r[3], index = r[4], error = r[5], eid = r[6];
            if (error) return -1;
            if (how == RULE_CROSSING) {
                if (expanded) break;
                expanded = 1;
                /* EventAssembler._expand_crossings: each layer allocation this template frees, once per full layer
                 * of its template layer, in layer order */
                for (Py_ssize_t fj = 0; fj < a->n; fj++) {
                    long long lt = a->layer_of[fj];
                    if (lt < 0 || lt >= a->L) return -1;
                    const long long *ci = a->d + a->d[H_CX_INDEX] + 2 * (t * a->L + lt);
                    const long long *cx = a->d + a->d[H_CX] + 3 * ci[0];
                    for (long long c = 0; c < ci[1]; c++) {
                        Py_ssize_t k = micros_at(a, lm, tm, cx[3 * c + 1], ms, 256);
                        if (k < 0) return -1;
                        for (Py_ssize_t q = 0; q < k; q++)
                            if (free_key(a, key_of(a, cx[3 * c], fj, ms[q], cx[3 * c + 2]), free_op) < 0) return -1;
                    }
                }
                break;
            }
            Py_ssize_t k = micros_at(a, lm, tm, ym, ms, 256);
            if (k < 0) return -1;
            if (how == RULE_ROLE) {
                for (Py_ssize_t q = 0; q < k; q++)
                    if (role_free(a, kind, j, yk, index, ms[q], free_op) < 0) return -1;
            } else if (how == RULE_OTHER && ((yt != -1 && yt == tt && j != -1) || (yt == -1 && tt == -1))) {
                /* the same layer's forward (saved activations), or a global segment's allocation */
                for (Py_ssize_t q = 0; q < k; q++)
                    if (free_key(a, key_of(a, yk, yt == -1 ? -1 : j, ms[q], eid), free_op) < 0) return -1;
            } else {
                return -1;
            }
            break;
        }
        default:
            return -1;
        }
    }
    /* EventAssembler._releases_into: the shared tensors placed at this segment's end (ids descending) */
    if (lm == -1) return 0;
    for (Py_ssize_t q = 0; q < nrel; q++) {
        long long eid = rel[q];
        if (eid < 0 || eid >= a->neid) return -1;
        long long at = a->d[a->d[H_ALLOC] + 2 * eid];
        if (at < 0) return -1;
        const long long *m = a->d + a->d[H_TID_META] + 3 * at;
        if (m[1] != -1 || m[2] == -1) return -1;
        long long tmk = lm < a->T - 1 ? lm : a->T - 1;
        if (free_key(a, key_of(a, m[0], -1, lm - (tmk - m[2]), eid), free_op) < 0) return -1;
    }
    return 0;
}

/* EventAssembler._repeat: micro-batch kk as a copy of kk - 1, keys moved on; 1 when made so, 0 when not. */
static int repeat_micro(Asm *a, Py_ssize_t kk, const long long *starts) {
    long long e_prev = starts[3 * (kk - 1)], b_prev = starts[3 * (kk - 1) + 1], k_prev = starts[3 * (kk - 1) + 2];
    long long k_before = starts[3 * (kk - 2) + 2];
    long long step = a->next_key - k_prev;
    if (step != k_prev - k_before) return 0;
    long long at = a->nev - e_prev;
    Py_ssize_t nb = a->nbd;
    for (Py_ssize_t b = (Py_ssize_t)b_prev; b < nb; b++) {
        long long s = a->bd[2 * b + 1];
        if (s < 2 || s + a->block >= a->nseg) return -1;
        long long ns = s + a->block;
        if (grow(&a->bd, &a->cap_bd, 2 * (a->nbd + 1), a) < 0) return -1;
        a->bd[2 * a->nbd] = a->bd[2 * b] + at;
        a->bd[2 * a->nbd + 1] = ns;
        a->nbd++;
        a->base[ns] = a->base[s] + step;
        a->tid[ns] = a->tid[s];
        a->done[ns] = a->done[s];
    }
    Py_ssize_t nw = a->nws;
    for (Py_ssize_t w = 0; w < nw; w++)
        if (a->ws[w] >= k_prev && push_ws(a, a->ws[w] + step) < 0) return -1;
    Py_ssize_t end = a->nev;
    if (grow(&a->ev, &a->cap_ev, 3 * (a->nev + (end - (Py_ssize_t)e_prev)), a) < 0) return -1;
    for (Py_ssize_t i = (Py_ssize_t)e_prev; i < end; i++) {
        long long *src = a->ev + 3 * i, *dst = a->ev + 3 * a->nev++;
        dst[0] = src[0];
        dst[1] = src[1] >= k_before ? src[1] + step : src[1];
        dst[2] = src[2];
    }
    a->next_key += step;
    return 1;
}

static int bytes_view(PyObject *obj, const long long **out, Py_ssize_t *n) {
    if (!PyBytes_CheckExact(obj) || PyBytes_GET_SIZE(obj) % (Py_ssize_t)sizeof(long long)) {
        PyErr_SetString(PyExc_TypeError, "assemble: tables, layer_of, releases and optimizer are int64 bytes");
        return -1;
    }
    *out = (const long long *)PyBytes_AS_STRING(obj);
    *n = PyBytes_GET_SIZE(obj) / (Py_ssize_t)sizeof(long long);
    return 0;
}

static PyObject *assemble(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "assemble(tables, layer_of, micro, labels, releases, optimizer, repeat, "
                                         "alloc_op, free_op, opt_label)");
        return NULL;
    }
    Asm a;
    memset(&a, 0, sizeof a);
    const long long *layer_of, *rel, *opt;
    Py_ssize_t nd, nl, nrel, nopt;
    if (bytes_view(args[0], &a.d, &nd) < 0 || bytes_view(args[1], &layer_of, &nl) < 0 ||
        bytes_view(args[4], &rel, &nrel) < 0 || bytes_view(args[5], &opt, &nopt) < 0)
        return NULL;
    PyObject *labels = args[3], *opt_label = args[9];
    Py_ssize_t micro = PyLong_AsSsize_t(args[2]);
    if (micro == -1 && PyErr_Occurred()) return NULL;
    int repeat = PyObject_IsTrue(args[6]);
    if (repeat < 0) return NULL;
    long long alloc_op = PyLong_AsLongLong(args[7]), free_op = PyLong_AsLongLong(args[8]);
    if (PyErr_Occurred()) return NULL;
    if (nd < H_SIZE || !PyList_CheckExact(labels) || micro < 1 || nrel % 2 || nopt % 3) Py_RETURN_NONE;
    a.L = a.d[H_L];
    a.T = a.d[H_T];
    a.neid = a.d[H_NEID];
    a.n = nl;
    a.micro = micro;
    a.layer_of = layer_of;
    a.block = 6 + 2 * a.n;
    a.nseg = 2 + a.micro * a.block;
    if (a.L < 1 || a.T < 1 || PyList_GET_SIZE(labels) != a.nseg) Py_RETURN_NONE;
    PyObject *result = NULL, *events = NULL, *bounds = NULL, *wss = NULL;
    long long *starts = NULL, *rel_eids = NULL;
    Py_ssize_t *rel_at = NULL;
    a.base = PyMem_Calloc((size_t)a.nseg, sizeof(long long));
    a.done = PyMem_Calloc((size_t)a.nseg, sizeof(long long));
    a.tid = PyMem_Malloc((size_t)a.nseg * sizeof(int));
    starts = PyMem_Malloc((size_t)(3 * a.micro) * sizeof(long long));
    rel_at = PyMem_Calloc((size_t)(a.nseg + 1), sizeof(Py_ssize_t));
    if (a.base == NULL || a.done == NULL || a.tid == NULL || starts == NULL || rel_at == NULL) {
        a.nomem = 1;
        goto fail;
    }
    for (Py_ssize_t s = 0; s < a.nseg; s++) a.tid[s] = -2; /* not made yet */
    /* the releases by segment: rel_at[s] .. rel_at[s + 1] */
    for (Py_ssize_t q = 0; q < nrel / 2; q++) {
        long long s = rel[2 * q];
        if (s < 0 || s >= a.nseg || (q && s < rel[2 * (q - 1)])) goto none;
        rel_at[s + 1]++;
    }
    for (Py_ssize_t s = 0; s < a.nseg; s++) rel_at[s + 1] += rel_at[s];
    rel_eids = PyMem_Malloc((size_t)(nrel / 2 + 1) * sizeof(long long));
    if (rel_eids == NULL) {
        a.nomem = 1;
        goto fail;
    }
    for (Py_ssize_t q = 0; q < nrel / 2; q++) rel_eids[q] = rel[2 * q + 1];
    /* a full segment (kind, layer or -1, micro-batch or -1) copying template (kind, template layer, tm) */
#define SEG(kind, j, m, tm)                                                                                    \
    {                                                                                                          \
        Py_ssize_t s_ = seg_index(&a, (kind), (j), (m));                                                       \
        if (s_ < 0 || segment(&a, s_, (kind), (j), (m), tid_of(&a, (kind), (j) == -1 ? -1 : a.layer_of[(j)], (tm)), \
                              rel_eids + rel_at[s_], rel_at[s_ + 1] - rel_at[s_], alloc_op, free_op) < 0)       \
            goto none;                                                                                         \
    }
    SEG(K_START, -1, -1, -1);
    for (Py_ssize_t kk = 0; kk < a.micro; kk++) {
        starts[3 * kk] = a.nev;
        starts[3 * kk + 1] = a.nbd;
        starts[3 * kk + 2] = a.next_key;
        long long tm = kk < a.T - 1 ? kk : a.T - 1;
        if (repeat && kk >= 3 && tm == 1) {
            int r = repeat_micro(&a, kk, starts);
            if (r < 0) goto none;
            if (r) continue;
        }
        SEG(K_PRE, -1, kk, tm);
        for (Py_ssize_t j = 0; j < a.n; j++) SEG(K_FWD, j, kk, tm);
        SEG(K_HEAD, -1, kk, tm);
        SEG(K_LOGITS, -1, kk, tm);
        SEG(K_EXIT, -1, kk, tm);
        SEG(K_BACK, -1, kk, tm);
        for (Py_ssize_t j = a.n - 1; j >= 0; j--) SEG(K_BWD, j, kk, tm);
        SEG(K_TAIL, -1, kk, tm);
    }
    /* StepEvents.add_optimizer: the whole model's optimizer step, its own allocations and frees */
    if (push_bd(&a, -1) < 0) goto fail;
    {
        long long obase = a.next_key, odone = 0;
        for (Py_ssize_t q = 0; q < nopt / 3; q++) {
            const long long *e = opt + 3 * q; /* (op, key from 0, bytes) */
            if (e[0] == alloc_op && e[1] == odone) {
                odone++;
                if (push_ev(&a, alloc_op, a.next_key++, e[2]) < 0) goto fail;
            } else if (e[0] == free_op && e[1] >= 0 && e[1] < odone) {
                if (push_ev(&a, free_op, obase + e[1], 0) < 0) goto fail;
            } else {
                goto none;
            }
        }
    }
    SEG(K_ZERO, -1, -1, -1);
#undef SEG
    /* the Python objects: the requests packed (int64 triples), (index, label) bounds, the workspace keys */
    events = PyBytes_FromStringAndSize((const char *)a.ev, (Py_ssize_t)(3 * a.nev * (Py_ssize_t)sizeof(long long)));
    bounds = PyList_New(a.nbd);
    wss = PyList_New(a.nws);
    if (events == NULL || bounds == NULL || wss == NULL) goto fail;
    for (Py_ssize_t b = 0; b < a.nbd; b++) {
        long long s = a.bd[2 * b + 1];
        PyObject *label = s < 0 ? opt_label : PyList_GET_ITEM(labels, (Py_ssize_t)s);
        PyObject *t = Py_BuildValue("(LO)", a.bd[2 * b], label);
        if (t == NULL) goto fail;
        PyList_SET_ITEM(bounds, b, t);
    }
    for (Py_ssize_t w = 0; w < a.nws; w++) {
        PyObject *k = PyLong_FromLongLong(a.ws[w]);
        if (k == NULL) goto fail;
        PyList_SET_ITEM(wss, w, k);
    }
    result = Py_BuildValue("(NNNL)", events, bounds, wss, a.next_key);
    events = bounds = wss = NULL;
    goto done;
none:
    if (a.nomem) goto fail;
    result = Py_NewRef(Py_None);
    goto done;
fail:
    if (a.nomem && !PyErr_Occurred()) PyErr_NoMemory();
    result = NULL;
done:
    Py_XDECREF(events);
    Py_XDECREF(bounds);
    Py_XDECREF(wss);
    PyMem_Free(a.base);
    PyMem_Free(a.done);
    PyMem_Free(a.tid);
    PyMem_Free(a.ev);
    PyMem_Free(a.bd);
    PyMem_Free(a.ws);
    PyMem_Free(starts);
    PyMem_Free(rel_at);
    PyMem_Free(rel_eids);
    return result;
}

/* -- replay: a point's whole process under the default settings, on C structs ----------------------------------- */
/* replay.replay_point's loop (no micro-batches skipped) and the general rules' default-settings path, with the blocks,
   the free lists and the live requests held here rather than as allocator.py's objects: no Python object is made per
   request. It serves what ``serve`` serves and what it leaves to the general rules under the default settings: a new
   segment that does not fit frees every cached whole segment (release_cached) and retries once (a counted retry),
   then runs out of memory (a counted OOM). The general rules are the reference (tests/test_native.py replays the same
   processes through both). Blocks are indices into one array; a pool's free blocks an array ordered by (size,
   address), as FreeList. */

typedef struct {
    long long addr, size;
    int prev, next; /* neighbours in the segment, -1 at its ends */
    char allocated, small;
} NBlock;

/* A pool's free blocks in (size, address) order, as one bucket per size it holds (by size), each bucket's blocks by
   address: a pool of LLaMA-7B's steps holds about 120 free blocks of about 10 sizes, so a block cached or taken moves
   a dozen entries of its bucket rather than half the pool (a sorted array of every block: its moves were a quarter of
   a replay). Only buckets that hold a block are listed; an emptied one's array is kept for the next size (spare). */
typedef struct {
    long long addr;
    int block;
} NAddr;

typedef struct {
    long long size;
    NAddr *items;
    Py_ssize_t n, cap;
} NBucket;

typedef struct {
    NBucket *buckets;
    Py_ssize_t n, cap, total; /* buckets listed, their room, blocks held in all */
    NBucket *spare;           /* emptied buckets' arrays (n 0), reused first */
    Py_ssize_t n_spare, cap_spare;
} NList;

typedef struct {
    NBlock *blocks;
    int *spare; /* indices of blocks merged away, reused first (as large as ``blocks``: pushing never fails) */
    int n_blocks, cap, n_spare;
    NList pools[2]; /* [0] large, [1] small */
    long long allocated, peak_allocated, reserved, peak_reserved, retries, ooms;
    long long next_addr, allowed, device_cap, large_segment, oom_size;
} NAlloc;

#define N_NOMEM (-2) /* the host ran out of memory here (MemoryError set) */

static int na_block(NAlloc *a, long long addr, long long size, int small) {
    int i;
    if (a->n_spare > 0) {
        i = a->spare[--a->n_spare];
    } else {
        if (a->n_blocks == a->cap) {
            int cap = a->cap ? a->cap * 2 : 4096;
            NBlock *blocks = PyMem_Realloc(a->blocks, (size_t)cap * sizeof(NBlock));
            if (blocks == NULL) {
                PyErr_NoMemory();
                return N_NOMEM;
            }
            a->blocks = blocks;
            int *spare = PyMem_Realloc(a->spare, (size_t)cap * sizeof(int));
            if (spare == NULL) {
                PyErr_NoMemory();
                return N_NOMEM;
            }
            a->spare = spare;
            a->cap = cap;
        }
        i = a->n_blocks++;
    }
    NBlock *b = &a->blocks[i];
    b->addr = addr;
    b->size = size;
    b->prev = b->next = -1;
    b->allocated = 0;
    b->small = (char)small;
    return i;
}

/* The first bucket of at least ``size`` bytes (l->n when none). */
static Py_ssize_t nl_bucket(const NList *l, long long size) {
    Py_ssize_t lo = 0, hi = l->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) >> 1;
        if (l->buckets[mid].size < size)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The first block of a bucket at ``addr`` or above (b->n when none). */
static Py_ssize_t nb_lower(const NBucket *b, long long addr) {
    Py_ssize_t lo = 0, hi = b->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) >> 1;
        if (b->items[mid].addr < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Unlist the (emptied) bucket ``at``, its array kept as a spare. 0, or N_NOMEM. */
static int nl_drop_bucket(NList *l, Py_ssize_t at) {
    if (l->n_spare == l->cap_spare) {
        Py_ssize_t cap = l->cap_spare ? l->cap_spare * 2 : 16;
        NBucket *spare = PyMem_Realloc(l->spare, (size_t)cap * sizeof(NBucket));
        if (spare == NULL) {
            PyErr_NoMemory();
            return N_NOMEM;
        }
        l->spare = spare;
        l->cap_spare = cap;
    }
    l->spare[l->n_spare++] = l->buckets[at];
    memmove(&l->buckets[at], &l->buckets[at + 1], (size_t)(l->n - at - 1) * sizeof(NBucket));
    l->n--;
    return 0;
}

/* Take the block at ``j`` out of bucket ``at`` (the bucket unlisted once empty). 0, or N_NOMEM. */
static int nl_remove(NList *l, Py_ssize_t at, Py_ssize_t j) {
    NBucket *b = &l->buckets[at];
    memmove(&b->items[j], &b->items[j + 1], (size_t)(b->n - j - 1) * sizeof(NAddr));
    b->n--;
    l->total--;
    return b->n ? 0 : nl_drop_bucket(l, at);
}

static int nl_insert(NList *l, long long size, long long addr, int block) {
    Py_ssize_t at = nl_bucket(l, size);
    if (at == l->n || l->buckets[at].size != size) { /* a size not held: its bucket listed */
        if (l->n == l->cap) {
            Py_ssize_t cap = l->cap ? l->cap * 2 : 16;
            NBucket *buckets = PyMem_Realloc(l->buckets, (size_t)cap * sizeof(NBucket));
            if (buckets == NULL) {
                PyErr_NoMemory();
                return N_NOMEM;
            }
            l->buckets = buckets;
            l->cap = cap;
        }
        NBucket fresh = {size, NULL, 0, 0};
        if (l->n_spare > 0) {
            fresh = l->spare[--l->n_spare];
            fresh.size = size;
            fresh.n = 0;
        }
        memmove(&l->buckets[at + 1], &l->buckets[at], (size_t)(l->n - at) * sizeof(NBucket));
        l->buckets[at] = fresh;
        l->n++;
    }
    NBucket *b = &l->buckets[at];
    if (b->n == b->cap) {
        Py_ssize_t cap = b->cap ? b->cap * 2 : 8;
        NAddr *items = PyMem_Realloc(b->items, (size_t)cap * sizeof(NAddr));
        if (items == NULL) {
            PyErr_NoMemory();
            return N_NOMEM;
        }
        b->items = items;
        b->cap = cap;
    }
    Py_ssize_t j = nb_lower(b, addr); /* (size, address) pairs are unique: bisect_left is insort's place */
    memmove(&b->items[j + 1], &b->items[j], (size_t)(b->n - j) * sizeof(NAddr));
    b->items[j].addr = addr;
    b->items[j].block = block;
    b->n++;
    l->total++;
    return 0;
}

/* Take a free neighbour out of its list: 0, -1 (it is not there, which the general rules never leave), N_NOMEM. */
static int nl_take(NList *l, const NBlock *b) {
    Py_ssize_t at = nl_bucket(l, b->size);
    if (at >= l->n || l->buckets[at].size != b->size) return -1;
    Py_ssize_t j = nb_lower(&l->buckets[at], b->addr);
    if (j >= l->buckets[at].n || l->buckets[at].items[j].addr != b->addr) return -1;
    return nl_remove(l, at, j);
}

static void nl_free(NList *l) {
    for (Py_ssize_t i = 0; i < l->n; i++) PyMem_Free(l->buckets[i].items);
    for (Py_ssize_t i = 0; i < l->n_spare; i++) PyMem_Free(l->spare[i].items);
    PyMem_Free(l->buckets);
    PyMem_Free(l->spare);
}

/* alloc_block: a new segment while the fraction and the device have room; -1 when they do not. */
static int na_segment(NAlloc *a, long long size, int small, int retry) {
    if (retry) a->retries++;
    if ((a->allowed >= 0 && a->reserved + size > a->allowed) || a->reserved + size > a->device_cap) return -1;
    int block = na_block(a, a->next_addr, size, small);
    if (block < 0) return block;
    a->next_addr += (size + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
    a->reserved += size;
    if (a->reserved > a->peak_reserved) a->peak_reserved = a->reserved;
    return block;
}

/* release_cached: free every cached block that is a whole segment, the large pool's, then the small pool's (each in
   (size, address) order). 0, or N_NOMEM. */
static int na_release_cached(NAlloc *a) {
    for (int p = 0; p < 2; p++) {
        NList *l = &a->pools[p];
        for (Py_ssize_t i = 0; i < l->n;) {
            NBucket *bucket = &l->buckets[i];
            Py_ssize_t kept = 0;
            for (Py_ssize_t j = 0; j < bucket->n; j++) {
                NBlock *b = &a->blocks[bucket->items[j].block];
                if (b->prev < 0 && b->next < 0) {
                    a->reserved -= b->size;
                    a->spare[a->n_spare++] = bucket->items[j].block;
                    l->total--;
                } else {
                    bucket->items[kept++] = bucket->items[j];
                }
            }
            bucket->n = kept;
            if (kept) {
                i++;
            } else if (nl_drop_bucket(l, i)) {
                return N_NOMEM;
            }
        }
    }
    return 0;
}

/* malloc: the block served (its index), -1 out of memory (``oom_size``: the segment it tried), or N_NOMEM. */
static int na_malloc(NAlloc *a, long long requested) {
    long long size = requested < MIN_BLOCK ? MIN_BLOCK : (requested + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
    int small = size <= SMALL_SIZE, block;
    NList *pool = &a->pools[small];
    Py_ssize_t at = nl_bucket(pool, size);
    if (at < pool->n) { /* get_free_block: the best fit (the smallest size held, its lowest address) */
        block = pool->buckets[at].items[0].block;
        if (nl_remove(pool, at, 0)) return N_NOMEM;
    } else {
        long long alloc = small ? SMALL_BUFFER
                                : size < MIN_LARGE_ALLOC ? a->large_segment
                                                         : (size + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
        block = na_segment(a, alloc, small, 0);
        if (block == -1) {
            if (na_release_cached(a)) return N_NOMEM;
            block = na_segment(a, alloc, small, 1);
        }
        if (block == -1) {
            a->ooms++;
            a->oom_size = alloc;
        }
        if (block < 0) return block;
    }
    long long remaining = a->blocks[block].size - size;
    if (small ? remaining >= MIN_BLOCK : remaining > SMALL_SIZE) { /* should_split: the rest is cached */
        int rest = na_block(a, a->blocks[block].addr + size, remaining, small);
        if (rest < 0) return rest;
        NBlock *b = &a->blocks[block], *r = &a->blocks[rest];
        r->prev = block;
        r->next = b->next;
        if (b->next >= 0) a->blocks[b->next].prev = rest;
        b->next = rest;
        b->size = size;
        if (nl_insert(pool, remaining, r->addr, rest)) return N_NOMEM;
    }
    NBlock *b = &a->blocks[block];
    b->allocated = 1;
    a->allocated += b->size;
    if (a->allocated > a->peak_allocated) a->peak_allocated = a->allocated;
    return block;
}

/* free -> free_block: merged with its free neighbours (try_merge_blocks), cached. 0, -1 (a neighbour missing from
   its list), or N_NOMEM. */
static int na_free(NAlloc *a, int block) {
    NBlock *b = &a->blocks[block];
    NList *pool = &a->pools[(int)b->small];
    int prev = b->prev, next = b->next;
    b->allocated = 0;
    a->allocated -= b->size;
    if (prev >= 0 && !a->blocks[prev].allocated) {
        NBlock *s = &a->blocks[prev];
        int taken = nl_take(pool, s);
        if (taken) return taken;
        b->addr = s->addr;
        b->prev = s->prev;
        if (s->prev >= 0) a->blocks[s->prev].next = block;
        b->size += s->size;
        a->spare[a->n_spare++] = prev;
    }
    if (next >= 0 && !a->blocks[next].allocated) {
        NBlock *s = &a->blocks[next];
        int taken = nl_take(pool, s);
        if (taken) return taken;
        b->next = s->next;
        if (s->next >= 0) a->blocks[s->next].prev = block;
        b->size += s->size;
        a->spare[a->n_spare++] = next;
    }
    return nl_insert(pool, b->size, b->addr, block);
}

/* One step's requests as read from a StepEvents' list (or its packed requests): whether each allocates, its key, its
   bytes; and which of them the optimizer step makes (its state: kept for good). */
typedef struct {
    char *alloc;
    int *key;
    long long *bytes;
    Py_ssize_t n, state_begin, state_end;
} NStep;

static void nstep_free(NStep *s) {
    PyMem_Free(s->alloc);
    PyMem_Free(s->key);
    PyMem_Free(s->bytes);
}

#define MAX_KEY (1 << 28) /* a step's keys count its requests from 0 (StepEvents): the live requests, an array */

/* 1 read, 0 not a plain stream (the caller replays it in Python), -1 error. ``max_key``: raised to its largest key. */
static int nstep_read(PyObject *events, Py_ssize_t state_begin, Py_ssize_t state_end, long alloc_op, NStep *s,
                      int *max_key) {
    int packed = PyBytes_CheckExact(events); /* StepEvents.packed: int64 (op, key, bytes) triples */
    if (!packed && !PyList_CheckExact(events)) return 0;
    if (packed && PyBytes_GET_SIZE(events) % (Py_ssize_t)(3 * sizeof(long long))) return 0;
    Py_ssize_t n = packed ? PyBytes_GET_SIZE(events) / (Py_ssize_t)(3 * sizeof(long long)) : PyList_GET_SIZE(events);
    s->n = n;
    s->state_begin = state_begin;
    s->state_end = state_end;
    s->alloc = PyMem_Malloc((size_t)(n ? n : 1));
    s->key = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int));
    s->bytes = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(long long));
    if (s->alloc == NULL || s->key == NULL || s->bytes == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (packed) {
        const long long *e = (const long long *)PyBytes_AS_STRING(events);
        for (Py_ssize_t i = 0; i < n; i++, e += 3) {
            if (e[1] < 0 || e[1] >= MAX_KEY || e[2] < 0 || e[2] > MAX_REQUEST) return 0;
            s->alloc[i] = e[0] == alloc_op;
            s->key[i] = (int)e[1];
            s->bytes[i] = e[2];
            if (e[1] > *max_key) *max_key = (int)e[1];
        }
        return 1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ev = PyList_GET_ITEM(events, i);
        if (!PyTuple_CheckExact(ev) || PyTuple_GET_SIZE(ev) != 3) return 0;
        PyObject *op = PyTuple_GET_ITEM(ev, 0), *key = PyTuple_GET_ITEM(ev, 1), *nbytes = PyTuple_GET_ITEM(ev, 2);
        if (!PyLong_CheckExact(op) || !PyLong_CheckExact(key) || !PyLong_CheckExact(nbytes)) return 0;
        int overflow = 0;
        long o = PyLong_AsLongAndOverflow(op, &overflow);
        long long k = overflow ? -1 : PyLong_AsLongLongAndOverflow(key, &overflow);
        long long b = overflow ? -1 : PyLong_AsLongLongAndOverflow(nbytes, &overflow);
        if (PyErr_Occurred()) return -1;
        if (overflow || k < 0 || k >= MAX_KEY || b < 0 || b > MAX_REQUEST) return 0;
        s->alloc[i] = o == alloc_op;
        s->key[i] = (int)k;
        s->bytes[i] = b;
        if (k > *max_key) *max_key = (int)k;
    }
    return 1;
}

/* Allocate ``sizes`` for good (zero bytes: nothing): 0, -1 out of memory, N_NOMEM, or -3 not plain. */
static int na_keep(NAlloc *a, PyObject *sizes) {
    if (!PyTuple_CheckExact(sizes)) return -3;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sizes); i++) {
        int overflow = 0;
        long long n = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(sizes, i), &overflow);
        if (n == -1 && PyErr_Occurred()) return N_NOMEM;
        if (overflow || n < 0 || n > MAX_REQUEST) return -3;
        if (n > 0) {
            int block = na_malloc(a, n);
            if (block < 0) return block;
        }
    }
    return 0;
}

/* Replay one step: 0 served, -1 out of memory at request ``*at``, N_NOMEM, or -3 a request the general rules must
   answer (a free of a key not live, a key made twice). ``live``: one entry per key, -1 where none. ``losses``: where
   the blocks it leaves (but the optimizer state) are appended, or NULL. */
static int na_step(NAlloc *a, const NStep *s, int *live, int max_key, int *losses, Py_ssize_t *n_losses,
                   Py_ssize_t *at) {
    memset(live, 0xff, (size_t)(max_key + 1) * sizeof(int));
    for (Py_ssize_t i = 0; i < s->n; i++) {
        int key = s->key[i];
        if (s->alloc[i]) {
            if (live[key] >= 0) return -3;
            int block = na_malloc(a, s->bytes[i]);
            if (block < 0) {
                *at = i;
                return block;
            }
            live[key] = block;
        } else {
            int block = live[key];
            if (block < 0) return -3;
            live[key] = -1;
            int err = na_free(a, block);
            if (err) return err == -1 ? -3 : err;
        }
    }
    if (losses != NULL) {
        for (Py_ssize_t i = 0; i < s->n; i++) {
            if (s->alloc[i] && live[s->key[i]] >= 0 && (i < s->state_begin || i >= s->state_end)) {
                losses[(*n_losses)++] = live[s->key[i]];
                live[s->key[i]] = -1;
            }
        }
    }
    return 0;
}

/* The large pool's free blocks, as (size, address) pairs, and the reserved bytes: two steps that end alike repeat
   (large_pool_state). Plain numbers, compared as memory: no padding between them. */
typedef struct {
    long long *pairs;
    Py_ssize_t n;
    long long reserved;
} NState;

static int nstate_take(const NAlloc *a, NState *st) {
    const NList *l = &a->pools[0];
    long long *pairs = PyMem_Realloc(st->pairs, (size_t)(l->total ? 2 * l->total : 1) * sizeof(long long));
    if (pairs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    st->pairs = pairs;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < l->n; i++) { /* which block holds them does not matter */
        for (Py_ssize_t j = 0; j < l->buckets[i].n; j++, k++) {
            st->pairs[2 * k] = l->buckets[i].size;
            st->pairs[2 * k + 1] = l->buckets[i].items[j].addr;
        }
    }
    st->n = k;
    st->reserved = a->reserved;
    return 0;
}

static int nstate_equal(const NState *x, const NState *y) {
    return x->reserved == y->reserved && x->n == y->n &&
           memcmp(x->pairs, y->pairs, (size_t)(2 * x->n) * sizeof(long long)) == 0;
}

/* replay(first, first_state, steady, steady_state, workspaces, build, batch_bytes, warmup_steps, measured_steps,
 *        allowed, device_cap, large_segment_size, alloc_op)
 * -> (peak_allocated, peak_reserved, retries, retries_before_window, oom) or None. */
static PyObject *replay(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "replay(first, first_state, steady, steady_state, workspaces, build, "
                                         "batch_bytes, warmup_steps, measured_steps, allowed, device_cap, "
                                         "large_segment_size, alloc_op)");
        return NULL;
    }
    Py_ssize_t fb, fe, sb, se;
    if (!PyArg_ParseTuple(args[1], "nn", &fb, &fe) || !PyArg_ParseTuple(args[3], "nn", &sb, &se)) return NULL;
    long long batch = PyLong_AsLongLong(args[6]);
    long warmup = PyLong_AsLong(args[7]), measured = PyLong_AsLong(args[8]), alloc_op = PyLong_AsLong(args[12]);
    NAlloc a;
    memset(&a, 0, sizeof(a));
    a.allowed = PyLong_AsLongLong(args[9]);
    a.device_cap = PyLong_AsLongLong(args[10]);
    a.large_segment = PyLong_AsLongLong(args[11]);
    a.next_addr = 1LL << 40;
    if (PyErr_Occurred()) return NULL;
    PyObject *result = NULL, *batch_sizes = NULL;
    NStep steps[2];
    memset(steps, 0, sizeof(steps));
    NState before = {NULL, 0, 0}, after = {NULL, 0, 0};
    int *live = NULL, *losses = NULL, max_key = 0, code = 0;
    Py_ssize_t n_losses = 0, at = -1;
    long phase = 0; /* 0 setup, 1..warmup the warm-up steps, then the measured ones */
    long long retries_before = 0;
    int plain = nstep_read(args[0], fb, fe, alloc_op, &steps[0], &max_key);
    if (plain == 1) plain = nstep_read(args[2], sb, se, alloc_op, &steps[1], &max_key);
    if (plain == 1 && max_key > 4 * (steps[0].n + steps[1].n) + 4096) plain = 0; /* sparse keys: a map, not an array */
    if (plain <= 0) {
        if (plain == 0) result = Py_NewRef(Py_None);
        goto done;
    }
    live = PyMem_Malloc((size_t)(max_key + 1) * sizeof(int));
    losses = PyMem_Malloc((size_t)(steps[0].n + (warmup > 1 ? (warmup - 1) : 0) * steps[1].n + 1) * sizeof(int));
    batch_sizes = Py_BuildValue("(L)", batch);
    if (live == NULL || losses == NULL || batch_sizes == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    code = na_keep(&a, args[4]);
    if (code == 0) code = na_keep(&a, args[5]);
    if (code == 0) code = na_keep(&a, batch_sizes);
    for (long w = 0; code == 0 && w < warmup; w++) {
        phase = 1 + w;
        code = na_step(&a, &steps[w == 0 ? 0 : 1], live, max_key, losses, &n_losses, &at);
    }
    if (code == 0) {
        for (Py_ssize_t i = 0; i < n_losses && code == 0; i++) { /* the warm-up losses, dropped when it returns */
            code = na_free(&a, losses[i]);
            if (code == -1) code = -3;
        }
    }
    if (code == 0) {
        a.peak_allocated = a.allocated; /* reset_peak_memory_stats */
        a.peak_reserved = a.reserved;
        retries_before = a.retries;
        code = nstate_take(&a, &before) ? N_NOMEM : 0;
    }
    for (long m = 0; code == 0 && m < measured; m++) {
        phase = 1 + warmup + m;
        code = na_step(&a, &steps[1], live, max_key, NULL, NULL, &at);
        if (code == 0 && nstate_take(&a, &after)) code = N_NOMEM;
        if (code == 0) {
            if (nstate_equal(&before, &after)) break; /* every later step repeats this one: its peaks are reached */
            NState swap = before;
            before = after;
            after = swap;
        }
    }
    if (code == N_NOMEM) goto done;
    if (code == -3) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (code == -1) {
        result = Py_BuildValue("(LLLL(lnLLL))", a.peak_allocated, a.peak_reserved, a.retries, retries_before, phase,
                               phase == 0 ? (Py_ssize_t)-1 : at, a.oom_size, a.allocated, a.reserved);
    } else {
        result = Py_BuildValue("(LLLLO)", a.peak_allocated, a.peak_reserved, a.retries, retries_before, Py_None);
    }
done:
    Py_XDECREF(batch_sizes);
    nstep_free(&steps[0]);
    nstep_free(&steps[1]);
    PyMem_Free(before.pairs);
    PyMem_Free(after.pairs);
    PyMem_Free(live);
    PyMem_Free(losses);
    PyMem_Free(a.blocks);
    PyMem_Free(a.spare);
    nl_free(&a.pools[0]);
    nl_free(&a.pools[1]);
    return result;
}

static PyMethodDef module_methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind(Block, AllocatorSegment): the classes whose slots serve reads and writes, and whose objects it makes; "
     "TypeError (and the earlier binding kept) unless their slots and __init__ are what this build expects."},
    {"serve", (PyCFunction)(void (*)(void))serve, METH_FASTCALL,
     "serve(requests, start, live, small, large, small_age, large_age, stats, alloc_op, segments) -> (index, "
     "next_addr): serve requests from ``start`` under the default settings until one is left to the general rules "
     "(its index; len(requests) when none is). ``segments``: None (leave a request that needs a new segment), or "
     "(allowed bytes or -1, what the device has, large_segment_size, the next segment's address, "
     "Stats.segment_events or None) to make new segments while there is room."},
    {"assemble", (PyCFunction)(void (*)(void))assemble, METH_FASTCALL,
     "assemble(tables, layer_of, micro, labels, releases, optimizer, repeat, alloc_op, free_op, opt_label) -> "
     "(packed, bounds, workspaces, next_key) or None: event_assembly.EventAssembler.run on integer tables, its "
     "requests packed as int64 (op, key, bytes) triples "
     "(ShortTemplate.native_tables); None where the reference would raise (run it then)."},
    {"copy_program", (PyCFunction)(void (*)(void))copy_program, METH_FASTCALL,
     "copy_program(program, start, events, own, workspaces, next_key, alloc_op, free_op) -> (next_key, index): "
     "event_assembly's copies of a template segment's allocations and local frees from ``start``, up to the first "
     "entry of another code (its index; len(program) when there is none)."},
    {"shift_events", (PyCFunction)(void (*)(void))shift_events, METH_FASTCALL,
     "shift_events(events, start, k_before, step) -> None: event_assembly's repeat of a micro-batch: each event of "
     "events[start:] appended again, its key moved on by step where it is at least k_before."},
    {"micro_plan", (PyCFunction)(void (*)(void))micro_plan, METH_FASTCALL,
     "micro_plan(events, starts, alloc_op) -> (keys, origin, freed, periodic_from) or None: replay.MicroPlan.of's "
     "loop over a step's events (None: an event it leaves to the pure-Python loop)."},
    {"replay", (PyCFunction)(void (*)(void))replay, METH_FASTCALL,
     "replay(first, first_state, steady, steady_state, workspaces, build, batch_bytes, warmup_steps, measured_steps, "
     "allowed, device_cap, large_segment_size, alloc_op) -> (peak_allocated, peak_reserved, retries, "
     "retries_before_window, oom) or None: replay.replay_point's process under the default settings, every "
     "micro-batch replayed; ``oom``: None or (phase, request index or -1, bytes, allocated, reserved), phase 0 the "
     "setup, 1.. the warm-up steps, then the measured ones. None: a stream it leaves to the general rules."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "ckptbench.estimator._replay_native",
    "The replayed caching allocator's fast path in C (optional; allocator.py's general rules are the reference).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__replay_native(void) {
    if (PyType_Ready(&FreeListType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    /* allocator.py compares it with the source beside it: a build older than its source is not used */
    if (PyModule_AddStringConstant(m, "SOURCE_HASH", CKPTBENCH_SOURCE_HASH) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&FreeListType);
    if (PyModule_AddObject(m, "FreeList", (PyObject *)&FreeListType) < 0) {
        Py_DECREF(&FreeListType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
