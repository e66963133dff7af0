#!/usr/bin/env bash
# Builds the ESP32-S3 toolchain (binutils 2.40, GCC 12.2 C + libgcc, newlib 3.3 for
# xtensa-esp32s3-elf) and qemu-system-xtensa 7.2 with an `esp32s3` CPU, from Debian's source
# packages plus the Tensilica core description of the ESP32-S3 (the "overlay"), into a cache
# outside the repository. Called by scripts/setup.sh; idempotent (a finished step leaves a stamp
# and is not done again), sources and build trees deleted after each install.
#
#   PREFIX   COLIBRI_ESP32S3_PREFIX, default ${XDG_CACHE_HOME:-~/.cache}/colibri/esp32s3
#            (bin/xtensa-esp32s3-elf-gcc, bin/qemu-system-xtensa, xtensa-esp32s3-elf/lib/libc.a)
#   OVERLAY  COLIBRI_XTENSA_OVERLAY: xtensa_esp32s3.tar.gz, a folder holding it, or its unpacked
#            xtensa_esp32s3/ folder; default ../shared/third_party/xtensa-overlays/ beside the
#            repository when it exists
#
# Nothing is built when xtensa-esp32s3-elf-gcc is already on PATH (ESP-IDF's export.sh puts
# Espressif's there) and a qemu-system-xtensa with an esp32s3 CPU is found, or when there is no
# overlay (the esp32s3 board then skips with a message saying how to get either).
# About 12 minutes on 2 cores, 4 GB of disk while building, 700 MB installed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="${COLIBRI_ESP32S3_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/colibri/esp32s3}"
TARGET=xtensa-esp32s3-elf
JOBS="${COLIBRI_BUILD_JOBS:-$(nproc)}"
# Bump when a step's recipe changes, so caches built by an older recipe are rebuilt.
RECIPE=1

step() { printf '==> %s\n' "$*"; }
info() { printf '    %s\n' "$*"; }
die() { printf 'build_esp32s3.sh: error: %s\n' "$*" >&2; exit 1; }

BUILD_PACKAGES=(
    binutils-source gcc-12-source newlib-source dpkg-dev
    gcc g++ make flex bison texinfo libgmp-dev libmpfr-dev libmpc-dev
    ninja-build meson pkg-config libglib2.0-dev libpixman-1-dev zlib1g-dev python3
    xz-utils bzip2 patch
)

find_overlay() {
    local cand="${COLIBRI_XTENSA_OVERLAY:-$ROOT/../shared/third_party/xtensa-overlays}"
    [[ -e "$cand" ]] || return 1
    if [[ -f "$cand" ]]; then
        echo "$(cd "$(dirname "$cand")" && pwd)/$(basename "$cand")"
    elif [[ -f "$cand/xtensa_esp32s3.tar.gz" ]]; then
        echo "$(cd "$cand" && pwd)/xtensa_esp32s3.tar.gz"
    elif [[ -f "$cand/binutils/bfd/xtensa-modules.c" ]]; then
        (cd "$cand" && pwd)
    elif [[ -f "$cand/xtensa_esp32s3/binutils/bfd/xtensa-modules.c" ]]; then
        (cd "$cand/xtensa_esp32s3" && pwd)
    else
        die "COLIBRI_XTENSA_OVERLAY=$cand holds no ESP32-S3 overlay (xtensa_esp32s3.tar.gz or its unpacked folder)"
    fi
}

qemu_has_esp32s3() {
    "$1" -cpu help 2>/dev/null | grep -qw esp32s3
}

elapsed() { printf '%dm%02ds' $((SECONDS / 60)) $((SECONDS % 60)); }

stamp_ok() { [[ -f "$PREFIX/.stamp-$1" && "$(cat "$PREFIX/.stamp-$1")" == "$RECIPE $OVERLAY_ID" ]]; }
stamp_set() { echo "$RECIPE $OVERLAY_ID" >"$PREFIX/.stamp-$1"; }

# Runs a build command quietly, its output in a log; on failure prints the log's tail.
run_logged() {
    local log="$1"; shift
    if ! "$@" >>"$log" 2>&1; then
        tail -n 40 "$log" >&2
        die "'$*' failed in $(pwd) (full log: $log)"
    fi
}

install_build_packages() {
    local missing=() pkg
    for pkg in "${BUILD_PACKAGES[@]}"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    ((${#missing[@]} == 0)) && return
    [[ $(id -u) == 0 ]] || die "missing build packages (${missing[*]}); run as root or install them"
    info "installing build packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

unpack_overlay() {
    local dest="$1"
    mkdir -p "$dest"
    if [[ -f "$OVERLAY" ]]; then
        tar -xzf "$OVERLAY" -C "$dest" --strip-components=1
    else
        cp -r "$OVERLAY"/. "$dest"/
    fi
}

one_tarball() {
    local found
    found=$(ls $1 2>/dev/null | head -n1 || true)
    [[ -n "$found" ]] || die "source tarball $1 not found (is its -source package installed?)"
    echo "$found"
}

build_binutils() {
    stamp_ok binutils && { info "binutils: already built"; return; }
    info "binutils: unpacking"
    local src
    src=$(one_tarball "/usr/src/binutils/binutils-*.tar.*")
    tar -xf "$src" -C "$WORK"
    local dir
    dir=$(find "$WORK" -maxdepth 1 -type d -name 'binutils-*' | head -n1)
    cp "$OV/binutils/bfd/xtensa-modules.c" "$dir/bfd/"
    cp "$OV/binutils/include/xtensa-config.h" "$dir/include/"
    mkdir -p "$dir/build" && cd "$dir/build"
    info "binutils: building ($(elapsed))"
    run_logged "$WORK/binutils.log" ../configure --target="$TARGET" --prefix="$PREFIX" \
        --disable-nls --disable-werror --disable-gdb --disable-gdbserver --disable-sim \
        --disable-gprofng --disable-readline --disable-libdecnumber
    run_logged "$WORK/binutils.log" make -j"$JOBS"
    run_logged "$WORK/binutils.log" make install
    cd "$WORK" && rm -rf "$dir"
    stamp_set binutils
    info "binutils: installed ($(elapsed))"
}

build_gcc() {
    stamp_ok gcc && { info "gcc: already built"; return; }
    info "gcc: unpacking"
    local src
    src=$(one_tarball "/usr/src/gcc-12/gcc-*.tar.*")
    tar -xf "$src" -C "$WORK"
    local dir
    dir=$(find "$WORK" -maxdepth 1 -type d -name 'gcc-*' | head -n1)
    # Debian's -dfsg tarball lacks the GFDL manuals; without this patch the build stops at
    # s-tm-texi ("genhooks: No place specified to document hook ...").
    (cd "$dir" && patch -s -p2 </usr/src/gcc-12/patches/gcc-gfdl-build.diff)
    cp "$OV/gcc/include/xtensa-config.h" "$dir/include/"
    mkdir -p "$dir/build" && cd "$dir/build"
    info "gcc: building the C compiler and libgcc, about 8 minutes on 2 cores ($(elapsed))"
    run_logged "$WORK/gcc.log" ../configure --target="$TARGET" --prefix="$PREFIX" \
        --enable-languages=c --without-headers --with-newlib --disable-libssp --disable-shared \
        --disable-threads --disable-multilib --disable-nls --disable-libquadmath \
        --disable-libgomp --disable-libatomic --disable-lto --with-system-zlib
    run_logged "$WORK/gcc.log" make -j"$JOBS" all-gcc
    info "gcc: compiler built, now libgcc ($(elapsed))"
    run_logged "$WORK/gcc.log" make -j"$JOBS" all-target-libgcc
    run_logged "$WORK/gcc.log" make install-gcc install-target-libgcc
    cd "$WORK" && rm -rf "$dir"
    stamp_set gcc
    info "gcc: installed ($(elapsed))"
}

build_newlib() {
    stamp_ok newlib && { info "newlib: already built"; return; }
    info "newlib: unpacking"
    local src
    src=$(one_tarball "/usr/src/newlib/newlib-*.tar.*")
    tar -xf "$src" -C "$WORK"
    local dir
    dir=$(find "$WORK" -maxdepth 1 -type d -name 'newlib*' | head -n1)
    # newlib 3.3 has no Xtensa port: build its generic C (no setjmp, no syscalls).
    grep -q '^  xtensa\*)' "$dir/newlib/configure.host" ||
        sed -i 's/^  z8k)$/  xtensa*)\n\t;;\n  z8k)/' "$dir/newlib/configure.host"
    grep -q '^  xtensa\*)' "$dir/newlib/configure.host" || die "could not add xtensa to newlib's configure.host"
    mkdir -p "$dir/build" && cd "$dir/build"
    info "newlib: building ($(elapsed))"
    run_logged "$WORK/newlib.log" env PATH="$PREFIX/bin:$PATH" \
        CFLAGS_FOR_TARGET="-O2 -mlongcalls -ffunction-sections -fdata-sections" \
        ../configure --target="$TARGET" --prefix="$PREFIX" --disable-nls \
        --disable-newlib-supplied-syscalls --disable-libgloss
    run_logged "$WORK/newlib.log" env PATH="$PREFIX/bin:$PATH" make -j"$JOBS"
    run_logged "$WORK/newlib.log" env PATH="$PREFIX/bin:$PATH" make install
    cd "$WORK" && rm -rf "$dir"
    stamp_set newlib
    info "newlib: installed ($(elapsed))"
}

# QEMU's source is Debian's (7.2+dfsg, patches applied), fetched with `apt-get source` through a
# deb-src stanza derived from the machine's own sources and removed afterwards.
fetch_qemu_source() {
    local list=/etc/apt/sources.list.d/colibri-deb-src.sources f
    [[ $(id -u) == 0 ]] || die "apt-get source qemu needs a deb-src entry; run as root"
    : >"$list"
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ "$f" == "$list" ]] && continue
        grep -q '^Types:.*\bdeb\b' "$f" || continue
        grep -q '^URIs:.*debian\|^URIs:.*ubuntu' "$f" || continue
        sed -e 's/^Types:.*/Types: deb-src/' "$f" >>"$list"
        echo >>"$list"
    done
    if [[ -f /etc/apt/sources.list ]]; then
        sed -n 's/^deb \(.*\)/deb-src \1/p' /etc/apt/sources.list >/etc/apt/sources.list.d/colibri-deb-src.list
    fi
    local ok=0
    apt-get update -qq && (cd "$WORK" && apt-get source -qq qemu >"$WORK/qemu-source.log" 2>&1) && ok=1
    rm -f "$list" /etc/apt/sources.list.d/colibri-deb-src.list
    ((ok)) || { tail -n 20 "$WORK/qemu-source.log" >&2 || true; die "apt-get source qemu failed"; }
}

build_qemu() {
    stamp_ok qemu && { info "qemu: already built"; return; }
    info "qemu: fetching Debian's source"
    fetch_qemu_source
    local dir
    dir=$(find "$WORK" -maxdepth 1 -type d -name 'qemu-*' | head -n1)
    [[ -n "$dir" ]] || die "apt-get source qemu unpacked nothing"
    # The tarball target/xtensa/import_core.sh reads.
    local core="$WORK/core"
    mkdir -p "$core/xtensa/config" "$core/gdb" "$core/binutils"
    cp "$OV/newlib/newlib/libc/sys/xtensa/include/xtensa/config/core-isa.h" "$core/xtensa/config/"
    : >"$core/xtensa/config/core-matmap.h"  # no MPU on this core
    cp "$OV/gdb/gdb/xtensa-config.c" "$core/gdb/"
    cp "$OV/binutils/bfd/xtensa-modules.c" "$core/binutils/"
    tar -czf "$WORK/esp32s3-core.tgz" -C "$core" xtensa gdb binutils  # no ./ prefix: the
    # import script names the members (xtensa/config/core-isa.h) and strips two components
    cd "$dir"
    if [[ ! -f target/xtensa/core-esp32s3.c ]]; then
        run_logged "$WORK/qemu.log" bash target/xtensa/import_core.sh "$WORK/esp32s3-core.tgz" esp32s3 240000
    fi
    # The imported core has no opcode translators: every FPU op would trap as unimplemented.
    grep -q opcode_translators target/xtensa/core-esp32s3.c ||
        sed -i 's/^\(    \.clock_freq_khz = .*\)$/\1\n    .opcode_translators = (const XtensaOpcodeTranslators *[]){\n        \&xtensa_core_opcodes,\n        \&xtensa_fpu_opcodes,\n        NULL,\n    },/' \
            target/xtensa/core-esp32s3.c
    grep -q xtensa_fpu_opcodes target/xtensa/core-esp32s3.c || die "could not add the FPU translators"
    mkdir -p build && cd build
    info "qemu: building qemu-system-xtensa, about 3 minutes ($(elapsed))"
    run_logged "$WORK/qemu.log" ../configure --prefix="$PREFIX" --target-list=xtensa-softmmu \
        --disable-docs --disable-tools --disable-werror --enable-plugins --disable-gtk \
        --disable-sdl --disable-vnc --disable-opengl --disable-virglrenderer --disable-spice \
        --disable-curses --disable-libusb --disable-usb-redir --disable-xen --disable-kvm \
        --disable-guest-agent --disable-capstone --disable-slirp
    run_logged "$WORK/qemu.log" make -j"$JOBS" qemu-system-xtensa
    mkdir -p "$PREFIX/bin"
    install -m 0755 qemu-system-xtensa "$PREFIX/bin/qemu-system-xtensa"
    cd "$WORK" && rm -rf "$dir"
    qemu_has_esp32s3 "$PREFIX/bin/qemu-system-xtensa" || die "the built QEMU lists no esp32s3 CPU"
    stamp_set qemu
    info "qemu: installed ($(elapsed))"
}

main() {
    step "ESP32-S3 toolchain and QEMU core"
    local have_gcc="" have_qemu=""
    if command -v "$TARGET-gcc" >/dev/null && [[ "$(command -v "$TARGET-gcc")" != "$PREFIX/bin/"* ]]; then
        have_gcc="$(command -v "$TARGET-gcc")"
    fi
    local q
    for q in $(type -ap qemu-system-xtensa); do
        [[ "$q" == "$PREFIX/bin/"* ]] && continue
        qemu_has_esp32s3 "$q" && { have_qemu="$q"; break; }
    done
    if [[ -n "$have_gcc" && -n "$have_qemu" ]]; then
        info "using $have_gcc and $have_qemu from PATH (ESP-IDF); nothing to build"
        return
    fi
    if ! OVERLAY=$(find_overlay); then
        info "skipped: no ESP32-S3 core overlay (set COLIBRI_XTENSA_OVERLAY to xtensa_esp32s3.tar.gz"
        info "from espressif/xtensa-overlays) and no ESP-IDF toolchain on PATH; the esp32s3 board skips"
        return
    fi
    OVERLAY_ID=$(if [[ -f "$OVERLAY" ]]; then sha256sum "$OVERLAY"; else cat "$OVERLAY"/binutils/bfd/xtensa-modules.c | sha256sum; fi | cut -c1-16)
    mkdir -p "$PREFIX"
    local todo=()
    [[ -z "$have_gcc" ]] && todo+=(binutils gcc newlib)
    [[ -z "$have_qemu" ]] && todo+=(qemu)
    local s missing=()
    for s in "${todo[@]}"; do stamp_ok "$s" || missing+=("$s"); done
    if ((${#missing[@]} == 0)); then
        info "already built in $PREFIX"
        return
    fi
    info "building ${missing[*]} into $PREFIX (overlay ${OVERLAY#"$ROOT/"})"
    install_build_packages
    WORK="$(dirname "$PREFIX")/esp32s3-build.$$"
    rm -rf "$WORK" && mkdir -p "$WORK"
    trap 'rm -rf "$WORK"' EXIT
    OV="$WORK/overlay"
    unpack_overlay "$OV"
    for s in "${missing[@]}"; do
        cd "$WORK"
        "build_$s"
    done
    info "done in $(elapsed): $(du -sh "$PREFIX" | cut -f1) in $PREFIX"
}

main "$@"
