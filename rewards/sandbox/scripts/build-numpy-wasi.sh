#!/usr/bin/env bash
# numpy for the sandbox's guest, cross-compiled for wasm32-wasip1 from its sdist (PyPI, pinned
# by sha256) with numpy's own meson build, no BLAS (numpy's bundled lapack_lite) and no SIMD
# dispatch. Called by build-python-wasi.sh once CPython is configured and its sysconfig data
# generated, never alone:
#
#   build-numpy-wasi.sh SRC BUILD WORK
#
# SRC is CPython's source tree, BUILD its wasm32-wasi build folder. WASI preview 1 has no
# dynamic loading, so each extension module is compiled into an archive (the "linker" below
# archives instead of linking a shared object), and the interpreter links them in as built-in
# modules under their full names. Writes, under WORK/numpy:
#
#   areal_modules.h   the modules' init functions, declared and listed (Modules/config.c
#                     includes it: guest/static-extensions.patch)
#   link-args         the archives and libraries to link into the interpreter
#   site/numpy/       the Python package, without its tests
#
# numpy 1.26.4 is the version LiveCodeBench's grader environment pins
# (rewards/code/scripts/setup-lcb-grader.sh), so both run the same numpy.
#
# guest/numpy-wasi.patch makes numpy compute here as on 64-bit Linux: wasm32 is a CPU numpy
# knows; its default integer (np.int_, what Python ints, sums and arange become) is the 64-bit
# long long instead of C long, 32 bits on wasm32; the index arrays it makes (intp, 32 bits
# here) reach Python as 64-bit integers (`wide_indices.h`: argmax, argsort, nonzero,
# searchsorted, bincount, unique's and histogram's counts...); an integer array that would
# cast safely to a 64-bit intp is taken as indices (bincount, repeat, take); the legacy
# RandomState writes its C longs into arrays of C longs and returns them as the default
# integer; mtrand's own copy of the random distributions takes names of its own, since both
# it and libnpyrandom's are linked into one interpreter; and every function numpy calls
# through a pointer of another type takes the parameters of that type (the DType classes'
# getters, `_abstract` and the like, took one where `getter` passes two; `_get_castingimpl`
# two where its METH_KEYWORDS entry passes three): native code ignores the difference,
# WebAssembly traps ("indirect call type mismatch"), which pickling any numpy scalar, dtype
# or array did.
# Products of float and double matrices (matmul, and dot of two matrices) are blocked in
# registers with wasm SIMD, each element summed in the order numpy's own loop sums it.
set -euo pipefail

SRC="$1" BUILD="$2" WORK="$3"
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
NUMPY_VERSION=1.26.4
NUMPY_SHA256=2a02aba9ed12e4ac4eb3ea9421c420301a0c6460d9830d74a9df87efa4912010
NUMPY_URL="https://files.pythonhosted.org/packages/65/6e/09db70a523a96d25e115e71cc56a6f9031e7b8cd166c1ac8438307c14058/numpy-$NUMPY_VERSION.tar.gz"
NP="$WORK/numpy"
LLVM=/usr/lib/llvm-16
rm -rf "$NP"
mkdir -p "$NP/cross" "$NP/include/python3.11" "$NP/sysconfig"

# Build tools (Cython, ninja) in a scratch virtual environment; meson is numpy's vendored one.
/usr/bin/python3.11 -m venv "$NP/tools"
"$NP/tools/bin/pip" install --quiet --only-binary :all: 'Cython==3.0.11' 'ninja==1.11.1.1'

/usr/bin/python3.11 - "$NUMPY_URL" "$NP/numpy.tar.gz" <<'PY'
import sys, urllib.request
urllib.request.urlretrieve(sys.argv[1], sys.argv[2])
PY
echo "$NUMPY_SHA256  $NP/numpy.tar.gz" | sha256sum --check --quiet \
    || { echo "numpy-$NUMPY_VERSION.tar.gz does not have the sha256 this script pins" >&2; exit 1; }
tar -xzf "$NP/numpy.tar.gz" -C "$NP"
NUMPY_SRC="$NP/numpy-$NUMPY_VERSION"
patch -s -p1 -d "$NUMPY_SRC" <"$ROOT/rewards/sandbox/guest/numpy-wasi.patch"

# The guest's headers, and its sysconfig data pointing at them: meson asks the "host" Python
# (the native interpreter answering as the guest, below) where Python.h is.
cp -r "$SRC/Include/." "$NP/include/python3.11/"
cp "$BUILD/pyconfig.h" "$NP/include/python3.11/"
sed "s|'/usr/local/include/python3.11'|'$NP/include/python3.11'|g" \
    "$BUILD/build/lib.wasi-wasm32-3.11/_sysconfigdata__wasi_wasm32-wasi.py" \
    >"$NP/sysconfig/_sysconfigdata__wasi_wasm32-wasi.py"
cat >"$NP/cross/python" <<EOF
#!/bin/sh
# The native interpreter, answering sysconfig's questions as the wasm32-wasi guest.
export _PYTHON_SYSCONFIGDATA_NAME=_sysconfigdata__wasi_wasm32-wasi PYTHONPATH="$NP/sysconfig"
exec /usr/bin/python3.11 "\$@"
EOF
cat >"$NP/cross/cc" <<EOF
#!/usr/bin/env bash
# clang for wasm32-wasi. A link with -shared (an extension module) writes an archive of its
# objects instead, and the static libraries it names beside it (OUT.libs).
tool=clang-16
[[ "\$(basename "\$0")" == "c++" ]] && tool=clang++-16
for a in "\$@"; do
    if [[ "\$a" == "-shared" ]]; then
        out="" objs=() libs=()
        while ((\$#)); do
            case "\$1" in
                -o) out="\$2"; shift 2 ;;
                *.o) objs+=("\$1"); shift ;;
                *.a) libs+=("\$(realpath "\$1")"); shift ;;
                *) shift ;;
            esac
        done
        rm -f "\$out"
        $LLVM/bin/llvm-ar rcs "\$out" "\${objs[@]}"
        printf '%s\n' "\${libs[@]}" >"\$out.libs"
        exit 0
    fi
done
# Nothing is loaded dynamically: position-independent code would only be slower.
args=()
for a in "\$@"; do [[ "\$a" == -fPIC || "\$a" == -fpic ]] || args+=("\$a"); done
exec "\$tool" --target=wasm32-wasi "\${args[@]}"
EOF
cp "$NP/cross/cc" "$NP/cross/c++"
chmod +x "$NP/cross/python" "$NP/cross/cc" "$NP/cross/c++"
# C++: wasi-libc++ without exceptions (numpy's C++ uses none); CPython's WASI pthread stubs
# are declared with C's `restrict`. No signals (numpy's SIGINT handling needs setjmp).
defines="'-DNPY_NO_SIGNAL', '-D_WASI_EMULATED_SIGNAL', '-D_WASI_EMULATED_MMAN', '-D_WASI_EMULATED_PROCESS_CLOCKS'"
cat >"$NP/cross/wasi.cross" <<EOF
[binaries]
c = '$NP/cross/cc'
cpp = '$NP/cross/c++'
ar = '$LLVM/bin/llvm-ar'
strip = '$LLVM/bin/llvm-strip'
python = '$NP/cross/python'
python3 = '$NP/cross/python'
cython = '$NP/tools/bin/cython'
pkg-config = '/bin/false'

[host_machine]
system = 'wasi'
cpu_family = 'wasm32'
cpu = 'wasm32'
endian = 'little'

[properties]
longdouble_format = 'IEEE_QUAD_LE'
skip_sanity_check = true
needs_exe_wrapper = true

[built-in options]
c_args = [$defines]
cpp_args = ['-Drestrict=__restrict__', $defines, '-isystem', '$LLVM/include/wasm32-wasi/c++/v1', '-fno-exceptions']
EOF

export PATH="$NP/tools/bin:$PATH"
(cd "$NUMPY_SRC" && python vendored-meson/meson/meson.py setup "$NP/build" \
    --cross-file "$NP/cross/wasi.cross" --buildtype=release -Db_ndebug=if-release \
    -Dblas=none -Dlapack=none -Dallow-noblas=true -Ddisable-threading=true -Ddisable-svml=true \
    -Ddisable-optimization=true -Dcpu-baseline=none -Dcpu-dispatch=none) >"$NP/setup.log" 2>&1 \
    || { echo "numpy's meson setup failed: see $NP/setup.log" >&2; exit 1; }
ninja -C "$NP/build" >"$NP/ninja.log" 2>&1 || { echo "numpy's build failed: see $NP/ninja.log" >&2; exit 1; }
(cd "$NUMPY_SRC" && python vendored-meson/meson/meson.py install -C "$NP/build" --no-rebuild \
    --destdir "$NP/stage") >"$NP/install.log" 2>&1 \
    || { echo "numpy's install failed: see $NP/install.log" >&2; exit 1; }

# The modules the guest gets (numpy's test-only modules and its SIMD test module left out;
# _multiarray_tests stays: numpy's _add_newdocs imports it),
# their archives, and the static libraries they link, each once.
: >"$NP/areal_modules.h"
archives=() libs=()
while read -r so; do
    rel="${so#"$NP/build/"}"
    name="${rel%%.cpython-*}"
    base="${name##*/}"
    case "$base" in _umath_tests | _rational_tests | _struct_ufunc_tests | _operand_flag_tests | _simd) continue ;; esac
    dotted="${name//\//.}"
    printf '#ifndef AREAL_INITTAB\nextern PyObject *PyInit_%s(void);\n#else\n{"%s", PyInit_%s},\n#endif\n' \
        "$base" "$dotted" "$base" >>"$NP/areal_modules.h"
    archives+=("$so")
    while read -r lib; do
        [[ -n "$lib" ]] && libs+=("$lib")
    done <"$so.libs"
done < <(find "$NP/build/numpy" -name '*.cpython-311-wasm32-wasi.so' | sort)
printf '%s\n' "${archives[@]}" $(printf '%s\n' "${libs[@]}" | sort -u) \
    "-L$LLVM/lib/wasm32-wasi" -lc++ -lc++abi -lc-printscan-long-double >"$NP/link-args"

site="$(find "$NP/stage" -type d -name numpy -path '*-packages/numpy' | head -1)"
mkdir -p "$NP/site"
cp -r "$site" "$NP/site/numpy"
find "$NP/site/numpy" -name tests -type d -prune -exec rm -rf {} +
find "$NP/site/numpy" \( -name '*.so' -o -name '*.a' -o -name '*.pxd' -o -name '*.pyi' -o -name '*.h' \) -delete
rm -rf "$NP/site/numpy/core/include" "$NP/site/numpy/core/lib" "$NP/site/numpy/random/lib"
echo "numpy $NUMPY_VERSION: $(wc -l <"$NP/areal_modules.h" | awk '{print $1 / 5}') extension modules"
