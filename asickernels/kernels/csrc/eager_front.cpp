// Front: the base of every op object (asickernels/kernels/eager_front.py). Its call looks up
// the route of a repeated eager call from the arguments' types, shapes and dtypes; on a hit
// it calls the route with the positional arguments and nothing else runs in Python. The key
// is eager_front.python_numpy_key's, built here because in Python it cost 3-5 µs of a
// 15-30 µs small call (Python is slow between two XLA calls: cold caches).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

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

void front_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  front_clear(self);
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

PyMODINIT_FUNC PyInit_asickernels_eager_front() {
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
  front_type.tp_dealloc = front_dealloc;
  front_type.tp_getset = front_getset;
  if (PyType_Ready(&front_type) < 0) return nullptr;
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  Py_INCREF(&front_type);
  if (PyModule_AddObject(module, "Front", reinterpret_cast<PyObject*>(&front_type)) < 0) {
    Py_DECREF(&front_type);
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
