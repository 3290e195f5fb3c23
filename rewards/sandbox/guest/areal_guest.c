/* The pre-initialisable interpreter: CPython as a WASI reactor with two entry points.
 *
 *   wizer.initialize  starts CPython and runs the Python source it reads from stdin (the
 *                     grader's harness, which imports LiveCodeBench's prelude and defines
 *                     `areal_main`). The host snapshots the instance right after, with
 *                     wasmtime-wizer: every run then starts from an initialised interpreter.
 *   areal_run         calls `__main__.areal_main()`, which reads its job from stdin and ends
 *                     the process itself (`os._exit`).
 *
 * Built by scripts/build-python-wasi.sh against the same libpython as python.wasm.
 */
#include "Python.h"

#include <stdlib.h>
#include <unistd.h>

static char *read_all_stdin(void) {
    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1 >= cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
        ssize_t n = read(0, buf + len, cap - len - 1);
        if (n <= 0) {
            break;
        }
        len += (size_t)n;
    }
    buf[len] = '\0';
    return buf;
}

__attribute__((export_name("wizer.initialize"))) void areal_initialize(void) {
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.parse_argv = 0;
    config.install_signal_handlers = 0;
    config.write_bytecode = 0;
    char *argv[] = {"python", NULL};
    PyStatus status = PyConfig_SetBytesArgv(&config, 1, argv);
    if (!PyStatus_Exception(status)) {
        status = Py_InitializeFromConfig(&config);
    }
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) {
        Py_ExitStatusException(status);
    }
    char *source = read_all_stdin();
    int rc = PyRun_SimpleString(source);
    free(source);
    fflush(NULL);
    if (rc != 0) {
        abort(); /* the snapshot must not be taken of a failed initialisation */
    }
}

__attribute__((export_name("areal_run"))) void areal_run(void) {
    int rc = PyRun_SimpleString("import __main__\n__main__.areal_main()\n");
    fflush(NULL);
    _exit(rc == 0 ? 0 : 2);
}
