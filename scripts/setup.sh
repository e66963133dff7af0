#!/usr/bin/env bash
# Colibri set-up on a fresh Debian 12 / Ubuntu machine (run as root; idempotent).
#
#   1. Debian packages: cross toolchains, QEMU, Python, clang-format, valgrind, cmake and
#      pkg-config (tests/targets/test_install.py), clang with libFuzzer / ASan / UBSan runtimes
#      (fuzz/, tests/runtime/test_fuzz.py) (only if missing)
#   2. build/tools/xtensa-lx106/libgcc-extra.a: the integer-division and soft-float helpers that
#      Debian's lx106 libgcc leaves out (the ESP8266 ROM has them), from gcc-12-source's
#      libgcc/config/xtensa/lib1funcs.S plus tools/xtensa_libgcc/int64.c
#   3. build/tools/libicount.so: the QEMU TCG plugin that counts guest instructions
#   4. .venv with `pip install -e '.[test]'` (when pyproject.toml exists)
#   5. the ESP32-S3 toolchain and QEMU core (scripts/build_esp32s3.sh): built once from Debian's
#      source packages and the core overlay (COLIBRI_XTENSA_OVERLAY, default
#      ../shared/third_party/xtensa-overlays) into ~/.cache/colibri/esp32s3, about 12 minutes on
#      2 cores the first time, seconds afterwards; nothing when ESP-IDF's are on PATH or there is
#      no overlay (the esp32s3 board then skips, saying how to get either)
#
# Environment: COLIBRI_SKIP_APT=1 skips step 1; PYTHON=python3.11 picks the venv's interpreter;
# COLIBRI_SKIP_ESP32S3=1 skips step 5.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/build/tools"
PYTHON="${PYTHON:-python3}"

step() { printf '==> %s\n' "$*"; }
info() { printf '    %s\n' "$*"; }
die() { printf 'setup.sh: error: %s\n' "$*" >&2; exit 1; }

APT_PACKAGES=(
    gcc libc6-dev
    gcc-aarch64-linux-gnu libc6-dev-arm64-cross
    gcc-arm-linux-gnueabihf libc6-dev-armhf-cross
    qemu-user
    gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm
    gcc-xtensa-lx106 picolibc-xtensa-lx106-elf qemu-system-misc gcc-12-source
    python3 python3-venv python3-pip
    clang-format valgrind
    clang libclang-rt-14-dev
    cmake pkg-config
    ccache
    xz-utils
    chromium-headless-shell
)

install_packages() {
    step "Debian packages"
    if [[ "${COLIBRI_SKIP_APT:-0}" == 1 ]]; then
        info "skipped (COLIBRI_SKIP_APT=1)"
        return
    fi
    local missing=() pkg
    for pkg in "${APT_PACKAGES[@]}"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if ((${#missing[@]} == 0)); then
        info "all ${#APT_PACKAGES[@]} packages already installed"
        return
    fi
    [[ $(id -u) == 0 ]] || die "missing packages (${missing[*]}); run as root or install them"
    info "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    info "done"
}

# Helpers the lx106 link needs (see docs in boards/xtensa-lx106.toml). Names are lib1funcs.S
# sections (-DL_<name>); only those missing from Debian's libgcc.a are built, so nothing is
# defined twice.
XTENSA_LIB1_FUNCS=(
    udivsi3 divsi3 umodsi3 umulsidi3
    addsubsf3 mulsf3 fixunssfsi floatsisf
    addsubdf3 muldf3 divdf3 fixdfsi fixunsdfsi floatsidf truncdfsf2 extendsfdf2
)

build_xtensa_libgcc() {
    step "Xtensa lx106 libgcc helpers"
    local out="$TOOLS/xtensa-lx106/libgcc-extra.a"
    if [[ -f "$out" ]]; then
        info "already built: ${out#"$ROOT"/}"
        return
    fi
    command -v xtensa-lx106-elf-gcc >/dev/null || { info "skipped: xtensa-lx106-elf-gcc missing"; return; }
    local tarball
    tarball=$(ls /usr/src/gcc-12/gcc-*.tar.* 2>/dev/null | head -n1 || true)
    [[ -n "$tarball" ]] || die "gcc-12-source is not installed (/usr/src/gcc-12/gcc-*.tar.*)"
    local gcc_version config_h
    gcc_version=$(xtensa-lx106-elf-gcc -dumpversion)
    config_h="/usr/lib/gcc/xtensa-lx106-elf/$gcc_version/plugin/include/xtensa-config.h"
    [[ -f "$config_h" ]] || die "lx106 core configuration $config_h not found"

    local work
    work=$(mktemp -d)
    trap 'rm -rf "$work"' RETURN
    info "extracting libgcc/config/xtensa from ${tarball##*/}"
    tar -xf "$tarball" -C "$work" --wildcards '*/libgcc/config/xtensa/*'
    local src
    src=$(echo "$work"/*/libgcc/config/xtensa)
    [[ -f "$src/lib1funcs.S" ]] || die "lib1funcs.S not found in $tarball"

    local fn cflags=(-O2 -mlongcalls -I"$(dirname "$config_h")")
    for fn in "${XTENSA_LIB1_FUNCS[@]}"; do
        xtensa-lx106-elf-gcc "${cflags[@]}" -c -DL_"$fn" "$src/lib1funcs.S" -o "$work/$fn.o"
    done
    xtensa-lx106-elf-gcc -std=c11 -Wall -Wextra -Werror "${cflags[@]}" \
        -c "$ROOT/tools/xtensa_libgcc/int64.c" -o "$work/int64.o"
    mkdir -p "$(dirname "$out")"
    rm -f "$out.tmp"
    xtensa-lx106-elf-ar rcs "$out.tmp" "$work"/*.o
    mv "$out.tmp" "$out"
    info "built ${out#"$ROOT"/} ($(xtensa-lx106-elf-nm "$out" | grep -c ' T ') functions)"
}

build_icount_plugin() {
    step "QEMU instruction-count plugin"
    local out="$TOOLS/libicount.so" src="$ROOT/tools/qemu_icount/icount.c"
    if [[ -f "$out" && "$out" -nt "$src" ]]; then
        info "already built: ${out#"$ROOT"/}"
        return
    fi
    command -v gcc >/dev/null || die "gcc is needed to build the plugin (apt-get install gcc)"
    mkdir -p "$TOOLS"
    gcc -std=c11 -O2 -Wall -Wextra -Werror -shared -fPIC "$src" -o "$out"
    info "built ${out#"$ROOT"/}"
}

setup_venv() {
    step "Python virtual environment (.venv)"
    if [[ ! -f "$ROOT/pyproject.toml" ]]; then
        info "skipped: no pyproject.toml yet"
        return
    fi
    if [[ ! -x "$ROOT/.venv/bin/python" ]]; then
        "$PYTHON" -m venv "$ROOT/.venv"
        info "created .venv ($("$ROOT/.venv/bin/python" --version))"
    fi
    local stamp="$ROOT/.venv/.colibri-installed" log="$ROOT/.venv/pip-install.log"
    if [[ -f "$stamp" && "$stamp" -nt "$ROOT/pyproject.toml" ]] &&
        "$ROOT/.venv/bin/python" -c 'import colibri' 2>/dev/null; then
        info "colibri already installed in .venv"
        return
    fi
    if ! { "$ROOT/.venv/bin/pip" install -q --upgrade pip &&
        "$ROOT/.venv/bin/pip" install -q -e "$ROOT[test]"; } >"$log" 2>&1; then
        cat "$log" >&2
        die "pip install -e '.[test]' failed (log: ${log#"$ROOT"/})"
    fi
    touch "$stamp"
    info "installed colibri (editable) with test extras (log: ${log#"$ROOT"/})"
}

build_esp32s3() {
    if [[ "${COLIBRI_SKIP_ESP32S3:-0}" == 1 ]]; then
        step "ESP32-S3 toolchain and QEMU core"
        info "skipped (COLIBRI_SKIP_ESP32S3=1)"
        return
    fi
    "$ROOT/scripts/build_esp32s3.sh"
}

install_packages
build_xtensa_libgcc
build_icount_plugin
setup_venv
build_esp32s3
step "done"
