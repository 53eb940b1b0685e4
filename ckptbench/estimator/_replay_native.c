/* The replayed caching allocator's hot path in C: the free-block lists and ``serve``'s default-settings loop.

   Optional (setup.py builds it when a compiler is there; ``allocator.py`` falls back to its pure-Python loop,
   the reference this is tested against request by request). It works on allocator.py's own objects: ``Block``
   and ``AllocatorSegment`` (their __slots__ read and written at the offsets ``bind`` finds), and keeps
   the free blocks of one stream and pool in a ``FreeList``: an array ordered by (size, address), the order of
   BlockComparatorSize in c10/cuda/CUDACachingAllocator.cpp and of allocator.py's ``SortedBlocks``, with the same
   methods. ``serve`` also makes new segments while the device and the memory fraction have room for them (the
   first try of ``_alloc_block``); at the first request it cannot serve so, it stops and returns its index:
   allocator.py takes that slow path (freeing cached segments, retries, out of memory) in Python, then resumes. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

#define MIN_BLOCK 512LL
#define SMALL_SIZE (1LL << 20)
#define SMALL_BUFFER (2LL << 20)
#define MIN_LARGE_ALLOC (10LL << 20)
#define ROUND_LARGE (2LL << 20)

/* -- Block and AllocatorSegment slots ----------------------------------------------------------------------- */
static PyTypeObject *block_type = NULL, *segment_type = NULL;
static Py_ssize_t off_addr, off_size, off_allocated, off_requested, off_prev, off_next, off_segment, off_gc_base,
    off_mapped, off_key, off_seg_small, off_seg_addr, off_seg_size, off_seg_stream, off_seg_expandable, off_seg_page;
static PyObject *segment_alloc_str = NULL; /* "segment_alloc": the recorded action */

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

static int slot_offset(PyObject *type, const char *name, Py_ssize_t *off) {
    PyObject *descr = PyObject_GetAttrString(type, name);
    if (descr == NULL) return -1;
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        Py_DECREF(descr);
        PyErr_Format(PyExc_TypeError, "%s is not a __slots__ member", name);
        return -1;
    }
    *off = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_DECREF(descr);
    return 0;
}

static void set_slot(PyObject *obj, Py_ssize_t off, PyObject *value) { /* borrows value */
    PyObject *old = SLOT(obj, off);
    Py_INCREF(value);
    SLOT(obj, off) = value;
    Py_XDECREF(old);
}

static int set_slot_ll(PyObject *obj, Py_ssize_t off, long long value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) return -1;
    PyObject *old = SLOT(obj, off);
    SLOT(obj, off) = v; /* steals v */
    Py_XDECREF(old);
    return 0;
}

static int get_slot_ll(PyObject *obj, Py_ssize_t off, long long *out) {
    PyObject *v = SLOT(obj, off);
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a Block slot is not set");
        return -1;
    }
    *out = PyLong_AsLongLong(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *bind(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *block, *segment;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &block, &PyType_Type, &segment)) return NULL;
    if (slot_offset(block, "addr", &off_addr) || slot_offset(block, "size", &off_size) ||
        slot_offset(block, "allocated", &off_allocated) || slot_offset(block, "requested", &off_requested) ||
        slot_offset(block, "prev", &off_prev) || slot_offset(block, "next", &off_next) ||
        slot_offset(block, "segment", &off_segment) || slot_offset(block, "gc_base", &off_gc_base) ||
        slot_offset(block, "mapped", &off_mapped) || slot_offset(block, "key", &off_key) ||
        slot_offset(segment, "small", &off_seg_small) || slot_offset(segment, "addr", &off_seg_addr) ||
        slot_offset(segment, "size", &off_seg_size) || slot_offset(segment, "stream", &off_seg_stream) ||
        slot_offset(segment, "expandable", &off_seg_expandable) || slot_offset(segment, "page", &off_seg_page))
        return NULL;
    if (segment_alloc_str == NULL && (segment_alloc_str = PyUnicode_InternFromString("segment_alloc")) == NULL)
        return NULL;
    Py_INCREF(block);
    Py_XSETREF(block_type, (PyTypeObject *)block);
    Py_INCREF(segment);
    Py_XSETREF(segment_type, (PyTypeObject *)segment);
    Py_RETURN_NONE;
}

/* A new Block(addr, size, segment) as Block.__init__ makes it (mapped, free, unlinked, age 0, nothing requested). */
static PyObject *new_block(long long addr, long long size, PyObject *segment) {
    PyObject *b = block_type->tp_alloc(block_type, 0);
    if (b == NULL) return NULL;
    if (set_slot_ll(b, off_addr, addr) || set_slot_ll(b, off_size, size) || set_slot_ll(b, off_gc_base, 0) ||
        set_slot_ll(b, off_requested, 0) || set_slot_ll(b, off_key, -1)) {
        Py_DECREF(b);
        return NULL;
    }
    set_slot(b, off_segment, segment);
    set_slot(b, off_mapped, Py_True);
    set_slot(b, off_allocated, Py_False);
    set_slot(b, off_prev, Py_None);
    set_slot(b, off_next, Py_None);
    return b;
}

/* A new AllocatorSegment(addr, size, 0, small=small, expandable=False, page=0): one cudaMalloc on stream 0. */
static PyObject *new_segment(long long addr, long long size, int small) {
    PyObject *seg = segment_type->tp_alloc(segment_type, 0);
    if (seg == NULL) return NULL;
    if (set_slot_ll(seg, off_seg_addr, addr) || set_slot_ll(seg, off_seg_size, size) ||
        set_slot_ll(seg, off_seg_stream, 0) || set_slot_ll(seg, off_seg_page, 0)) {
        Py_DECREF(seg);
        return NULL;
    }
    set_slot(seg, off_seg_small, small ? Py_True : Py_False);
    set_slot(seg, off_seg_expandable, Py_False);
    return seg;
}

/* -- FreeList ----------------------------------------------------------------------------------------------- */
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
    if (!PyObject_TypeCheck(block, block_type)) {
        PyErr_SetString(PyExc_TypeError, "expected a Block");
        return -1;
    }
    return (get_slot_ll(block, off_size, size) || get_slot_ll(block, off_addr, addr)) ? -1 : 0;
}

static PyObject *FreeList_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "FreeList() takes no arguments");
        return NULL;
    }
    if (block_type == NULL) {
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
    Py_INCREF(block);
    if (fl_insert(self, size, addr, block)) return NULL;
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

static PyObject *FreeList_at(FreeList *self, PyObject *arg) {
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0) i += self->n;
    if (i < 0 || i >= self->n) {
        PyErr_SetString(PyExc_IndexError, "FreeList index out of range");
        return NULL;
    }
    return Py_NewRef(self->items[i].block);
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

/* -- serve -------------------------------------------------------------------------------------------------- */

/* Unlink a free neighbour from its list before ``block`` absorbs it (try_merge_blocks); a new reference. */
static PyObject *take_neighbour(FreeList *fl, PyObject *other, long long *size, long long *addr) {
    if (get_slot_ll(other, off_size, size) || get_slot_ll(other, off_addr, addr)) return NULL;
    Py_ssize_t i = fl_find(fl, *size, *addr);
    return i < 0 ? NULL : fl_take(fl, i);
}

static int free_one(PyObject *block, FreeList *small_fl, FreeList *large_fl, PyObject *small_age,
                    PyObject *large_age, long long *allocated) {
    long long bsize, baddr, osize, oaddr;
    if (get_slot_ll(block, off_size, &bsize) || get_slot_ll(block, off_addr, &baddr)) return -1;
    set_slot(block, off_allocated, Py_False);
    *allocated -= bsize;
    PyObject *segment = SLOT(block, off_segment);
    int small = segment != NULL && SLOT(segment, off_seg_small) == Py_True;
    FreeList *fl = small ? small_fl : large_fl;
    PyObject *prev = SLOT(block, off_prev);
    if (prev != NULL && prev != Py_None && SLOT(prev, off_allocated) == Py_False) {
        PyObject *taken = take_neighbour(fl, prev, &osize, &oaddr);
        if (taken == NULL) return -1;
        PyObject *before = SLOT(prev, off_prev);
        baddr = oaddr;
        set_slot(block, off_prev, before); /* drops block's reference to prev; ``taken`` keeps it alive */
        if (before != Py_None) set_slot(before, off_next, block);
        bsize += osize;
        Py_DECREF(taken);
    }
    PyObject *next = SLOT(block, off_next);
    if (next != NULL && next != Py_None && SLOT(next, off_allocated) == Py_False) {
        PyObject *taken = take_neighbour(fl, next, &osize, &oaddr);
        if (taken == NULL) return -1;
        PyObject *after = SLOT(next, off_next);
        set_slot(block, off_next, after);
        if (after != Py_None) set_slot(after, off_prev, block);
        bsize += osize;
        Py_DECREF(taken);
    }
    if (set_slot_ll(block, off_addr, baddr) || set_slot_ll(block, off_size, bsize)) return -1;
    set_slot(block, off_gc_base, small ? small_age : large_age);
    Py_INCREF(block);
    return fl_insert(fl, bsize, baddr, block);
}

/* The allocator's counters that serve changes, read from the Stats object when it starts and written back when it
   stops (also when a request failed, as the Python loop's ``finally``). */
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

static PyObject *serve(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "serve(requests, start, live, small, large, small_age, large_age, stats, alloc_op, segments)");
        return NULL;
    }
    PyObject *requests = args[0], *live = args[2], *small_age = args[5], *large_age = args[6], *stats = args[7];
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
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), i = start;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int failed = 0;
    for (; i < n; i++) {
        PyObject *req = items[i];
        if (!PyTuple_Check(req) || PyTuple_GET_SIZE(req) != 3) {
            PyErr_SetString(PyExc_TypeError, "serve: a request is an (op, key, bytes) tuple");
            failed = 1;
            break;
        }
        PyObject *key = PyTuple_GET_ITEM(req, 1), *nbytes_obj = PyTuple_GET_ITEM(req, 2);
        long op = PyLong_AsLong(PyTuple_GET_ITEM(req, 0));
        if (op == -1 && PyErr_Occurred()) {
            failed = 1;
            break;
        }
        if (op != alloc_op) {
            PyObject *block = PyDict_GetItemWithError(live, key);
            if (block == NULL) {
                if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
                failed = 1;
                break;
            }
            Py_INCREF(block);
            if (PyDict_DelItem(live, key) ||
                free_one(block, small_fl, large_fl, small_age, large_age, &c[ALLOCATED])) {
                Py_DECREF(block);
                failed = 1;
                break;
            }
            Py_DECREF(block);
            continue;
        }
        long long nbytes = PyLong_AsLongLong(nbytes_obj);
        if (nbytes == -1 && PyErr_Occurred()) {
            failed = 1;
            break;
        }
        long long size = nbytes < MIN_BLOCK ? MIN_BLOCK : (nbytes + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
        int small = size <= SMALL_SIZE;
        FreeList *fl = small ? small_fl : large_fl;
        Py_ssize_t index = lower_bound(fl, size, LLONG_MIN);
        long long bsize, baddr;
        PyObject *block;
        if (index < fl->n) { /* get_free_block: the best fit */
            bsize = fl->items[index].size;
            baddr = fl->items[index].addr;
            block = fl_take(fl, index);
        } else { /* nothing cached fits: a new segment (get_allocation_size, alloc_block), when there is room */
            if (!seg.on) break;
            bsize = small ? SMALL_BUFFER
                          : size < MIN_LARGE_ALLOC ? seg.large_segment
                                                   : (size + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
            if ((seg.allowed >= 0 && c[RESERVED] + bsize > seg.allowed) || c[RESERVED] + bsize > seg.device_cap)
                break; /* allocator.py: free cached segments and retry, or out of memory */
            baddr = seg.next_addr;
            PyObject *segment = new_segment(baddr, bsize, small);
            block = segment == NULL ? NULL : new_block(baddr, bsize, segment);
            Py_XDECREF(segment);
            if (block == NULL) {
                failed = 1;
                break;
            }
            if (seg.record != NULL) {
                PyObject *event = Py_BuildValue("(OLL)", segment_alloc_str, baddr, bsize);
                int bad = event == NULL || PyList_Append(seg.record, event);
                Py_XDECREF(event);
                if (bad) {
                    Py_DECREF(block);
                    failed = 1;
                    break;
                }
            }
            seg.next_addr += (bsize + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
            c[RESERVED] += bsize;
            c[NUM_DEVICE_ALLOC] += 1;
            if (c[RESERVED] > c[PEAK_RESERVED]) c[PEAK_RESERVED] = c[RESERVED];
        }
        long long remaining = bsize - size;
        if (small ? remaining >= MIN_BLOCK : remaining > SMALL_SIZE) { /* should_split, alloc_found_block */
            PyObject *rest = new_block(baddr + size, remaining, SLOT(block, off_segment));
            if (rest == NULL) {
                Py_DECREF(block);
                failed = 1;
                break;
            }
            PyObject *next = SLOT(block, off_next);
            set_slot(rest, off_prev, block);
            set_slot(rest, off_next, next);
            if (next != Py_None) set_slot(next, off_prev, rest);
            set_slot(block, off_next, rest);
            bsize = size;
            if (set_slot_ll(block, off_size, size)) {
                Py_DECREF(rest);
                Py_DECREF(block);
                failed = 1;
                break;
            }
            set_slot(rest, off_gc_base, small ? small_age : large_age);
            if (fl_insert(fl, remaining, baddr + size, rest)) {
                Py_DECREF(block);
                failed = 1;
                break;
            }
        }
        set_slot(block, off_allocated, Py_True);
        set_slot(block, off_requested, nbytes_obj);
        c[ALLOCATED] += bsize;
        if (c[ALLOCATED] > c[PEAK_ALLOCATED]) c[PEAK_ALLOCATED] = c[ALLOCATED];
        int err = PyDict_SetItem(live, key, block);
        Py_DECREF(block);
        if (err) {
            failed = 1;
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

static PyMethodDef module_methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind(Block, AllocatorSegment): the classes whose slots serve reads and writes, and makes."},
    {"serve", (PyCFunction)(void (*)(void))serve, METH_FASTCALL,
     "serve(requests, start, live, small, large, small_age, large_age, stats, alloc_op, segments) -> (index, "
     "next_addr): serve requests from ``start`` under the default settings until one needs the slow path (its index; "
     "len(requests) when none does). ``segments``: None (stop at a request that needs a new segment), or (allowed "
     "bytes or -1, what the device has, large_segment_size, the next segment's address, Stats.segment_events or "
     "None) to make new segments while there is room."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "ckptbench.estimator._replay_native",
    "The replayed caching allocator's hot path in C (optional; allocator.py is the reference).", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__replay_native(void) {
    if (PyType_Ready(&FreeListType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    /* allocator.py's NATIVE_ABI: a build older than the source it sits next to is not used */
    if (PyModule_AddIntConstant(m, "ABI", 2) < 0) {
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
