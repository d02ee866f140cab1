// Front: the base of every op object (asickernels/kernels/eager_front.py). Its call looks up
// the route of a repeated eager call from the arguments' types, shapes and dtypes; on a hit
// it calls the route with the positional arguments and nothing else runs in Python. The key
// is eager_front.python_numpy_key's, built here because in Python it cost 3-5 µs of a
// 15-30 µs small call (Python is slow between two XLA calls: cold caches).
//
// InPlaceCall: a route that passes a table of its numpy arguments' addresses to a compiled
// function instead of the arrays (asickernels/backends/cpu/in_place.py).
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <cstdint>
#include <cstring>

namespace {

struct Front {
  PyObject_HEAD
  PyObject* routes;  // dict: numpy key -> route, taking the positional arguments
};

PyObject* shape_name;
PyObject* dtype_name;
PyObject* miss_name;

// (type(a), a.shape, a.dtype) for each positional argument, then the keyword (name, value)
// items in the order given, then the keyword values' types; NULL with an error set on
// failure (AttributeError for an argument without a shape, as in Python).
PyObject* numpy_key(PyObject* args, PyObject* kwargs) {
  const Py_ssize_t positional = PyTuple_GET_SIZE(args);
  const Py_ssize_t keywords = kwargs == nullptr ? 0 : PyDict_GET_SIZE(kwargs);
  PyObject* key = PyTuple_New(positional + 2 * keywords);
  if (key == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < positional; ++i) {
    PyObject* arg = PyTuple_GET_ITEM(args, i);
    PyObject* shape = PyObject_GetAttr(arg, shape_name);
    if (shape == nullptr) goto fail;
    PyObject* dtype = PyObject_GetAttr(arg, dtype_name);
    if (dtype == nullptr) {
      Py_DECREF(shape);
      goto fail;
    }
    PyObject* entry = PyTuple_Pack(3, reinterpret_cast<PyObject*>(Py_TYPE(arg)), shape, dtype);
    Py_DECREF(shape);
    Py_DECREF(dtype);
    if (entry == nullptr) goto fail;
    PyTuple_SET_ITEM(key, i, entry);
  }
  if (keywords > 0) {
    Py_ssize_t position = 0;
    Py_ssize_t j = positional;
    PyObject* name;
    PyObject* value;
    while (PyDict_Next(kwargs, &position, &name, &value)) {
      PyObject* item = PyTuple_Pack(2, name, value);
      if (item == nullptr) goto fail;
      PyTuple_SET_ITEM(key, j, item);
      PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(value));
      Py_INCREF(type);
      PyTuple_SET_ITEM(key, j + keywords, type);
      ++j;
    }
  }
  return key;
fail:
  Py_DECREF(key);  // a tuple's unset items are NULL, which its deallocation skips
  return nullptr;
}

// The Python rule's `except (AttributeError, TypeError)`: no numpy key for this call.
bool no_key_error() {
  if (!PyErr_ExceptionMatches(PyExc_AttributeError) && !PyErr_ExceptionMatches(PyExc_TypeError))
    return false;
  PyErr_Clear();
  return true;
}

PyObject* front_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  PyObject* routes = reinterpret_cast<Front*>(self)->routes;
  PyObject* key = numpy_key(args, kwargs);
  if (key != nullptr) {
    PyObject* route = PyDict_GetItemWithError(routes, key);  // borrowed
    if (route != nullptr) {
      Py_DECREF(key);
      Py_INCREF(route);  // the call may replace the routes
      PyObject* result = PyObject_Call(route, args, nullptr);
      Py_DECREF(route);
      return result;
    }
    if (PyErr_Occurred()) {  // an unhashable key
      Py_DECREF(key);
      key = nullptr;
    }
  }
  if (key == nullptr) {
    if (!no_key_error()) return nullptr;
    key = Py_NewRef(Py_None);
  }
  PyObject* given = kwargs != nullptr ? Py_NewRef(kwargs) : PyDict_New();
  PyObject* result = nullptr;
  if (given != nullptr) {
    result = PyObject_CallMethodObjArgs(self, miss_name, key, args, given, nullptr);
    Py_DECREF(given);
  }
  Py_DECREF(key);
  return result;
}

PyObject* front_new(PyTypeObject* type, PyObject*, PyObject*) {
  PyObject* self = type->tp_alloc(type, 0);
  if (self == nullptr) return nullptr;
  reinterpret_cast<Front*>(self)->routes = PyDict_New();
  if (reinterpret_cast<Front*>(self)->routes == nullptr) {
    Py_DECREF(self);
    return nullptr;
  }
  return self;
}

int front_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(reinterpret_cast<Front*>(self)->routes);
  return 0;
}

int front_clear(PyObject* self) {
  Py_CLEAR(reinterpret_cast<Front*>(self)->routes);
  return 0;
}

// The deallocation of a garbage-collected type whose references `clear` drops.
template <int (*clear)(PyObject*)>
void dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  clear(self);
  Py_TYPE(self)->tp_free(self);
}

PyObject* get_routes(PyObject* self, void*) {
  PyObject* routes = reinterpret_cast<Front*>(self)->routes;
  return Py_NewRef(routes != nullptr ? routes : Py_None);
}

int set_routes(PyObject* self, PyObject* value, void*) {
  if (value == nullptr || !PyDict_CheckExact(value)) {
    PyErr_SetString(PyExc_TypeError, "_numpy_routes must be a dict");
    return -1;
  }
  Py_XSETREF(reinterpret_cast<Front*>(self)->routes, Py_NewRef(value));
  return 0;
}

PyGetSetDef front_getset[] = {
    {"_numpy_routes", get_routes, set_routes,
     "Routes of earlier eager calls, by numpy key (see eager_front.python_numpy_key).",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject front_type = {PyVarObject_HEAD_INIT(nullptr, 0)};

struct InPlaceCall {
  PyObject_HEAD
  PyObject* function;  // uint32 [2 * arrays] address table -> results
  PyObject* fallback;  // the arrays -> results
};

PyObject* block_name;

// function(table of the arrays' addresses), once its results are ready (the arrays are read
// until then, and the caller may change or free them after we return); fallback(*arrays)
// when an argument is not a C-contiguous numpy array aligned for its dtype.
PyObject* in_place_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  auto* call = reinterpret_cast<InPlaceCall*>(self);
  if (kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0) {
    PyErr_SetString(PyExc_TypeError, "InPlaceCall takes arrays by position only");
    return nullptr;
  }
  const Py_ssize_t count = PyTuple_GET_SIZE(args);
  npy_intp table_size = 2 * count;
  PyObject* table = PyArray_SimpleNew(1, &table_size, NPY_UINT32);
  if (table == nullptr) return nullptr;
  auto* addresses = static_cast<char*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(table)));
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject* arg = PyTuple_GET_ITEM(args, i);
    constexpr int kReadable = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED;
    if (!PyArray_CheckExact(arg) ||
        !PyArray_CHKFLAGS(reinterpret_cast<PyArrayObject*>(arg), kReadable)) {
      Py_DECREF(table);
      return PyObject_Call(call->fallback, args, nullptr);
    }
    const auto address =
        reinterpret_cast<uint64_t>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(arg)));
    std::memcpy(addresses + i * sizeof(uint64_t), &address, sizeof(uint64_t));
  }
  PyObject* result = PyObject_CallOneArg(call->function, table);
  Py_DECREF(table);
  if (result == nullptr) return nullptr;
  const bool several = PyTuple_Check(result);
  const Py_ssize_t leaves = several ? PyTuple_GET_SIZE(result) : 1;
  for (Py_ssize_t i = 0; i < leaves; ++i) {
    PyObject* leaf = several ? PyTuple_GET_ITEM(result, i) : result;
    PyObject* ready = PyObject_CallMethodNoArgs(leaf, block_name);
    if (ready == nullptr) {
      Py_DECREF(result);
      return nullptr;
    }
    Py_DECREF(ready);
  }
  return result;
}

PyObject* in_place_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject* function;
  PyObject* fallback;
  static const char* keywords[] = {"function", "fallback", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:InPlaceCall", const_cast<char**>(keywords),
                                   &function, &fallback)) {
    return nullptr;
  }
  PyObject* self = type->tp_alloc(type, 0);
  if (self == nullptr) return nullptr;
  reinterpret_cast<InPlaceCall*>(self)->function = Py_NewRef(function);
  reinterpret_cast<InPlaceCall*>(self)->fallback = Py_NewRef(fallback);
  return self;
}

int in_place_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(reinterpret_cast<InPlaceCall*>(self)->function);
  Py_VISIT(reinterpret_cast<InPlaceCall*>(self)->fallback);
  return 0;
}

int in_place_clear(PyObject* self) {
  Py_CLEAR(reinterpret_cast<InPlaceCall*>(self)->function);
  Py_CLEAR(reinterpret_cast<InPlaceCall*>(self)->fallback);
  return 0;
}

PyTypeObject in_place_type = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* key_function(PyObject*, PyObject* const* args, Py_ssize_t count) {
  if (count != 2 || !PyTuple_Check(args[0]) || !PyDict_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "numpy_key(args: tuple, kwargs: dict)");
    return nullptr;
  }
  PyObject* key = numpy_key(args[0], args[1]);
  if (key == nullptr) {
    if (!no_key_error()) return nullptr;
    Py_RETURN_NONE;
  }
  if (PyObject_Hash(key) == -1) {
    Py_DECREF(key);
    if (!no_key_error()) return nullptr;
    Py_RETURN_NONE;
  }
  return key;
}

PyMethodDef module_methods[] = {
    {"numpy_key", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(key_function)),
     METH_FASTCALL, "The numpy route key of (args, kwargs), None where there is none."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "asickernels_eager_front",
                          "The C Front of asickernels.kernels.eager_front.", -1,
                          module_methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

// Adds a ready type to the module; false with an error set on failure.
bool add_type(PyObject* module, const char* name, PyTypeObject* type) {
  Py_INCREF(type);
  if (PyModule_AddObject(module, name, reinterpret_cast<PyObject*>(type)) < 0) {
    Py_DECREF(type);
    return false;
  }
  return true;
}

PyMODINIT_FUNC PyInit_asickernels_eager_front() {
  import_array();
  block_name = PyUnicode_InternFromString("block_until_ready");
  if (block_name == nullptr) return nullptr;
  shape_name = PyUnicode_InternFromString("shape");
  dtype_name = PyUnicode_InternFromString("dtype");
  miss_name = PyUnicode_InternFromString("_miss");
  if (shape_name == nullptr || dtype_name == nullptr || miss_name == nullptr) return nullptr;
  front_type.tp_name = "asickernels_eager_front.Front";
  front_type.tp_basicsize = sizeof(Front);
  front_type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC;
  front_type.tp_doc = "Base of an op: looks up the route of a repeated eager call.";
  front_type.tp_new = front_new;
  front_type.tp_call = front_call;
  front_type.tp_traverse = front_traverse;
  front_type.tp_clear = front_clear;
  front_type.tp_dealloc = dealloc<front_clear>;
  front_type.tp_getset = front_getset;
  in_place_type.tp_name = "asickernels_eager_front.InPlaceCall";
  in_place_type.tp_basicsize = sizeof(InPlaceCall);
  in_place_type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  in_place_type.tp_doc =
      "InPlaceCall(function, fallback)(*arrays): function(uint32 table of the arrays' "
      "addresses) once its results are ready, else fallback(*arrays).";
  in_place_type.tp_new = in_place_new;
  in_place_type.tp_call = in_place_call;
  in_place_type.tp_traverse = in_place_traverse;
  in_place_type.tp_clear = in_place_clear;
  in_place_type.tp_dealloc = dealloc<in_place_clear>;
  if (PyType_Ready(&front_type) < 0 || PyType_Ready(&in_place_type) < 0) return nullptr;
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  if (!add_type(module, "Front", &front_type) ||
      !add_type(module, "InPlaceCall", &in_place_type)) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
