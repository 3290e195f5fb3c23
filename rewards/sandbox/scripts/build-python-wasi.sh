#!/usr/bin/env bash
# Build the sandbox's guest interpreter: CPython 3.11 for wasm32-wasip1, from Debian's own
# source package, with Debian's clang-16 / lld-16 / wasi-libc, and a 64 MiB C stack (the ready
# WASI builds on PyPI have 512 KiB, so memoised recursion traps ~100 deep); numpy linked in
# (build-numpy-wasi.sh, from its sdist on PyPI), sympy and mpmath beside the standard library
# (their wheels on PyPI, pure Python), each pinned by sha256.
#
# CPython and the toolchain come from the Debian archive through apt: the toolchain as
# packages, the source through a private deb-src list (the system's apt sources are not
# touched); apt checks both against the archive's signed indices. numpy, sympy and mpmath come
# from PyPI, each checked against the sha256 pinned here. Takes ~6 minutes on 2 cores
# (link-time optimisation included; numpy ~2 of them).
#
# Output, in $OUT (default $AREAL_PYTHON_WASI, else .cache/python-wasi):
#   python.wasm                   the interpreter (a WASI command: `python -c ...`)
#   areal-guest.wasm              the same interpreter as a reactor the sandbox pre-initialises
#   lib/python3.11/               its standard library (tests left out), mounted read-only
#   SHA256SUMS, PROVENANCE        the interpreter's sha256; versions and flags it was built with
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
OUT="${OUT:-${AREAL_PYTHON_WASI:-$ROOT/.cache/python-wasi}}"
WORK="${WORK:-$ROOT/.cache/python-wasi-build}"
SUITE="${DEBIAN_SUITE:-bookworm}"
STACK_BYTES=$((64 * 1024 * 1024))
# Bump when the recipe changes what is built: an older build is then rebuilt.
RECIPE=10
PACKAGES=(clang-16 lld-16 wasi-libc libclang-rt-16-dev-wasm32 libc++-16-dev-wasm32
          libc++abi-16-dev-wasm32 python3.11 python3.11-venv patch)
# Pure-Python packages for the guest's maths, as wheels: name, URL, sha256.
WHEELS=(
    "mpmath-1.3.0 https://files.pythonhosted.org/packages/43/e3/7d92a15f894aa0c9c4b49b8ee9ac9850d6e63b03c9c32c0367a13ae62209/mpmath-1.3.0-py3-none-any.whl a0b2b9fe80bbcd81a6647ff13108738cfb482d481d826cc0e02f5b35e5c88d2c"
    "sympy-1.13.3 https://files.pythonhosted.org/packages/99/ff/c87e0622b1dadea79d2fb0b25ade9ed98954c9033722eb707053d310d4f3/sympy-1.13.3-py3-none-any.whl 54612cf55a62755ee71824ce692986f23c88ffa77207b30c1368eda4a7060f73"
)

if [[ -f "$OUT/python.wasm" && -f "$OUT/SHA256SUMS" ]] && grep -qx "recipe: $RECIPE" "$OUT/PROVENANCE" \
    && (cd "$OUT" && sha256sum --quiet -c SHA256SUMS); then
    echo "python-wasi: up to date in $OUT"
    exit 0
fi

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "python-wasi: installing ${missing[*]}"
    SUDO=""
    [[ $(id -u) -eq 0 ]] || SUDO="sudo"
    install() { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null; }
    # A fresh machine may have no package lists yet.
    install "${missing[@]}" || { $SUDO apt-get update -q >/dev/null && install "${missing[@]}"; }
fi

rm -rf "$WORK"
mkdir -p "$WORK/apt/lists/partial" "$WORK/src"
echo "deb-src http://deb.debian.org/debian $SUITE main" >"$WORK/apt/sources.list"
APT=(-o "Dir::Etc::SourceList=$WORK/apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
     -o "Dir::State::Lists=$WORK/apt/lists" -o "APT::Sandbox::User=root")
apt-get "${APT[@]}" -q update >/dev/null
(cd "$WORK/src" && apt-get "${APT[@]}" -q source --download-only python3.11 >/dev/null)
ORIG="$(ls "$WORK"/src/python3.11_*.orig.tar.gz)"
DSC="$(ls "$WORK"/src/python3.11_*.dsc)"
tar -xzf "$ORIG" -C "$WORK/src"
SRC="$(ls -d "$WORK"/src/Python-3.11.*/)"
SRC="${SRC%/}"
# 64-bit hashes in the 32-bit guest (guest/hash64.patch): hash(), and the order of sets and
# frozensets, as 64-bit CPython's (docs/sandbox.md).
patch -s -p1 -d "$SRC" <"$ROOT/rewards/sandbox/guest/hash64.patch"
# numpy's extension modules are linked in as built-in modules under their full names
# (guest/static-extensions.patch; build-numpy-wasi.sh).
patch -s -p1 -d "$SRC" <"$ROOT/rewards/sandbox/guest/static-extensions.patch"

BUILD="$SRC/builddir/wasi"
mkdir -p "$BUILD"
cd "$BUILD"
# Host libraries (zlib, lzma, uuid) must not be found: the guest links against wasi-libc only.
# wasi-libc's clockid_t is a pointer, which CPython 3.11's time module stores as an int
# constant: allowed as a warning (those constants are unused in the guest).
# String hashes: configure falls back to FNV when it cannot test the target's alignment (a
# cross build), and 64-bit CPython hashes strings with SipHash-1-3: with FNV, sets of strings
# iterate in another order than natively.
# Link-time optimisation (--with-lto=full, with LLVM 16's own llvm-ar: Debian's default one is
# older and cannot read LLVM 16 bitcode) makes the guest ~5 % faster (docs/benchmarks.md).
# No bulk-memory instructions: the sandbox stops a guest by revoking access to its memory,
# which is safe only while no host code (a `memory.copy` libcall) touches that memory on the
# guest's behalf (docs/sandbox.md). (numpy's matrix products use SIMD, which is guest code.)
export PKG_CONFIG_PATH="" PKG_CONFIG_LIBDIR=/nonexistent
CONFIG_SITE="$SRC/Tools/wasm/config.site-wasm32-wasi" \
LLVM_AR=/usr/lib/llvm-16/bin/llvm-ar LLVM_PROFDATA=/usr/lib/llvm-16/bin/llvm-profdata \
CC="clang-16 --target=wasm32-wasi" CPP="clang-16 --target=wasm32-wasi -E" \
AR=/usr/lib/llvm-16/bin/llvm-ar RANLIB=/usr/lib/llvm-16/bin/llvm-ranlib \
CFLAGS="-Wno-error=int-conversion" \
    "$SRC/configure" -C --host=wasm32-unknown-wasi --build="$(uname -m)-pc-linux-gnu" \
    --with-build-python=/usr/bin/python3.11 --disable-ipv6 --disable-shared --with-lto=full \
    --with-hash-algorithm=siphash13 \
    >"$WORK/configure.log" 2>&1 \
    || { echo "configure failed: see $WORK/configure.log" >&2; exit 1; }
# configure's WASI defaults link with a 512 KiB C stack and 10 MiB of initial memory (in
# LDFLAGS_NODIST, after LDFLAGS, so they win over anything passed in): replace the stack size
# and let the linker size the initial memory. The stack stays first in memory, so an overflow
# traps instead of overwriting data.
grep -q -- '-z stack-size=524288' Makefile \
    || { echo "configure no longer sets a 512 KiB stack: check LDFLAGS_NODIST in Makefile" >&2; exit 1; }
sed -i -e "s/-z stack-size=524288/-z stack-size=$STACK_BYTES/g" -e 's/-Wl,--initial-memory=[0-9]*//g' Makefile
# The pre-initialisable interpreter (guest/areal_guest.c): the same libpython linked as a WASI
# reactor with `wizer.initialize` and `areal_run` entry points.
cp "$ROOT/rewards/sandbox/guest/areal_guest.c" "$SRC/areal_guest.c"
cat >>Makefile <<'MAKE'

areal_guest.o: $(srcdir)/areal_guest.c $(PYTHON_HEADERS)
	$(CC) -c $(PY_CORE_CFLAGS) -o $@ $(srcdir)/areal_guest.c

areal-guest.wasm: areal_guest.o $(LINK_PYTHON_DEPS)
	$(LINKCC) $(PY_CORE_LDFLAGS) $(LINKFORSHARED) -mexec-model=reactor -o $@ areal_guest.o $(LINK_PYTHON_DEPS) $(LIBS) $(MODLIBS) $(SYSLIBS)
MAKE
# numpy needs the guest's sysconfig data, which make generates first; the interpreter is then
# linked with numpy's modules in.
make pybuilddir.txt >"$WORK/make.log" 2>&1 || { echo "make failed: see $WORK/make.log" >&2; exit 1; }
"$ROOT/rewards/sandbox/scripts/build-numpy-wasi.sh" "$SRC" "$BUILD" "$WORK"
cp "$WORK/numpy/areal_modules.h" "$BUILD/areal_modules.h"
make -j"$(nproc)" all areal-guest.wasm SYSLIBS="-lm $(tr '\n' ' ' <"$WORK/numpy/link-args")" \
    >>"$WORK/make.log" 2>&1 || { echo "make failed: see $WORK/make.log" >&2; exit 1; }

rm -rf "$OUT"
mkdir -p "$OUT/lib"
cp "$BUILD/python.wasm" "$BUILD/areal-guest.wasm" "$OUT/"
cp -r "$SRC/Lib" "$OUT/lib/python3.11"
rm -rf "$OUT/lib/python3.11/test" "$OUT/lib/python3.11/idlelib" "$OUT/lib/python3.11/tkinter" "$OUT/lib/python3.11/turtledemo"
find "$OUT/lib" -name __pycache__ -prune -exec rm -rf {} +
cp "$BUILD"/build/lib.wasi-wasm32-3.11/_sysconfigdata__wasi_wasm32-wasi.py "$OUT/lib/python3.11/"
# No extension modules are loaded from disk, but the interpreter looks for this folder.
mkdir -p "$OUT/lib/python3.11/lib-dynload"
cp -r "$WORK/numpy/site/numpy" "$OUT/lib/python3.11/numpy"
# A pure-Python wheel is installed by unpacking it.
for wheel in "${WHEELS[@]}"; do
    read -r name url sha <<<"$wheel"
    /usr/bin/python3.11 - "$name" "$url" "$sha" "$OUT/lib/python3.11" <<'PY'
import hashlib, io, sys, urllib.request, zipfile
name, url, sha, into = sys.argv[1:]
data = urllib.request.urlopen(url).read()
if hashlib.sha256(data).hexdigest() != sha:
    sys.exit(f"{name}: the wheel does not have the sha256 build-python-wasi.sh pins")
zipfile.ZipFile(io.BytesIO(data)).extractall(into)
PY
done
# sympy asks ctypes the width of C long, and the guest has no ctypes (guest/sympy-wasi.patch).
patch -s -p1 -d "$OUT/lib/python3.11" <"$ROOT/rewards/sandbox/guest/sympy-wasi.patch"
# Their own tests left out, as the standard library's and numpy's (sympy's are 40 % of it).
find "$OUT/lib/python3.11/sympy" "$OUT/lib/python3.11/mpmath" -name tests -type d -prune -exec rm -rf {} +
# The mount is read-only, so the guest cannot cache bytecode: compile it here, with hashes
# instead of timestamps (valid whatever the files' mtimes are). Files that are not Python 3
# (lib2to3's test data) are skipped.
/usr/bin/python3.11 -m compileall -q -j0 --invalidation-mode unchecked-hash "$OUT/lib/python3.11" >/dev/null 2>&1 || true
(cd "$OUT" && sha256sum python.wasm areal-guest.wasm >SHA256SUMS)
{
    echo "recipe: $RECIPE"
    echo "source: $(basename "$DSC") (Debian $SUITE), orig sha256 $(sha256sum "$ORIG" | cut -d' ' -f1)"
    echo "toolchain: $(clang-16 --version | head -1); wasi-libc $(dpkg-query -W -f='${Version}' wasi-libc)"
    echo "target: wasm32-wasip1, C stack $STACK_BYTES bytes, --disable-ipv6 --disable-shared --with-lto=full --with-hash-algorithm=siphash13, 64-bit hashes"
    echo "packages: numpy $(sed -n 's/^NUMPY_VERSION=//p' "$ROOT/rewards/sandbox/scripts/build-numpy-wasi.sh") (built in, 64-bit default integer), ${WHEELS[*]%% *}"
    sed 's/^\([0-9a-f]*\)  \(.*\)/\2 sha256: \1/' "$OUT/SHA256SUMS"
} >"$OUT/PROVENANCE"
[[ -n "${KEEP_BUILD:-}" ]] || rm -rf "$WORK"
cat "$OUT/PROVENANCE"
