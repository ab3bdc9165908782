/* What the compiled extensions (_packed_native.c, _supports_native.c) share: taking
 * an argument's memory through the buffer protocol, as they accept it or not at all,
 * and the module's definition from its method table. Included by each; setup.py
 * names it among their dependencies. */
#ifndef VLLM_SAMPLING_MASK_NATIVE_BUFFER_H
#define VLLM_SAMPLING_MASK_NATIVE_BUFFER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* The single struct-module format character of a native-order buffer, or 0. */
static char native_format(const Py_buffer *view)
{
    const char *format = view->format ? view->format : "B";
    if (*format == '@' || *format == '=')
        format++;
#if PY_LITTLE_ENDIAN
    else if (*format == '<')
        format++;
#endif
    return format[0] != '\0' && format[1] == '\0' ? format[0] : 0;
}

/* A C-contiguous buffer of `object` with `ndim` dimensions, a format among
 * `formats` and items of `itemsize` bytes (any size for 0); writable if asked.
 * 0, or -1 with no error set when `object` is not one. */
static int typed_buffer(PyObject *object, Py_buffer *view, int ndim, const char *formats,
                        Py_ssize_t itemsize, int writable)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(object, view, flags) < 0) {
        PyErr_Clear();
        return -1;
    }
    char format = native_format(view);
    if (view->ndim != ndim || format == 0 || strchr(formats, format) == NULL
            || (itemsize && view->itemsize != itemsize)) {
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The module `vllm_sampling_mask.NAME` of the file's `methods`, and its init. */
#define NATIVE_MODULE(NAME, DOC)                                                   \
    static struct PyModuleDef module = {                                           \
        PyModuleDef_HEAD_INIT, "vllm_sampling_mask." #NAME, DOC, -1, methods,      \
    };                                                                             \
    PyMODINIT_FUNC PyInit_##NAME(void)                                             \
    {                                                                              \
        return PyModule_Create(&module);                                           \
    }

#endif
