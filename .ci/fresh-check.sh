#!/usr/bin/env bash
# .ci/fresh-check.sh ROOT_DIR - the README's two commands on a machine that has nothing.
#
# Builds a minimal Debian root with debootstrap (Debian's minbase variant, from the mirror and
# release this machine uses), adds only what the README says a newcomer needs (make and a C
# compiler), copies a clean clone of the committed tree in, and runs there, as root:
#     make lab03 && mpirun --allow-run-as-root --oversubscribe -np 8 ./lab03
#     make test
# so every package the project needs must come from its own install step. Prints the time of
# each step and exits non-zero when one fails. A root from an earlier run is rebuilt only when
# FRESH_REUSE_ROOT=1 is not set. Needs root, debootstrap and network access to the mirror.
set -euo pipefail

root=${1:?usage: $0 ROOT_DIR}
repo=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" -eq 0 ] || { echo "fresh-check: must run as root (debootstrap, chroot)" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "fresh-check: debootstrap is not installed" >&2; exit 2; }

# The mirror and release this machine installs from.
mirror=$( { cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true; } |
         grep -oE '^(URIs:|deb) +https?://[^ ]+' | grep -v security | awk 'NR == 1 {print $2}' ||
         true)
mirror=${mirror:-http://deb.debian.org/debian}
# shellcheck disable=SC1091
release=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")

mounted=()
cleanup() {
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT

step() {   # step NAME COMMAND...: runs it, prints its time
    local name=$1 t0 t1
    shift
    echo "==== fresh-check: $name"
    t0=$(date +%s)
    if ! "$@"; then
        echo "fresh-check: $name FAILED after $(($(date +%s) - t0)) s"
        exit 1
    fi
    t1=$(date +%s)
    echo "fresh-check: $name took $((t1 - t0)) s"
    times+=("$name: $((t1 - t0)) s")
}
times=()

bootstrap() {
    if [ "${FRESH_REUSE_ROOT:-0}" = 1 ] && [ -f "$root/.fresh-root-ok" ]; then
        echo "reusing $root"
        return 0
    fi
    rm -rf "$root"
    mkdir -p "$root"
    debootstrap --variant=minbase "$release" "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
        { tail -30 "$root.debootstrap.log"; return 1; }
    touch "$root/.fresh-root-ok"
}

mount_all() {
    mount -t proc proc "$root/proc" && mounted+=("$root/proc")
    mount -t sysfs sysfs "$root/sys" && mounted+=("$root/sys")
    mount --bind /dev "$root/dev" && mounted+=("$root/dev")
    mount -t devpts devpts "$root/dev/pts" && mounted+=("$root/dev/pts")
    mkdir -p "$root/dev/shm"
    mount -t tmpfs -o size=2g tmpfs "$root/dev/shm" && mounted+=("$root/dev/shm")
    cp /etc/resolv.conf "$root/etc/resolv.conf"
}

in_root() {   # a login-like environment: nothing of this machine's variables
    chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        /bin/bash -c "$1"
}

# What the README asks of a newcomer: make, a C compiler, network. Nothing else.
newcomer_tools() {
    in_root 'export DEBIAN_FRONTEND=noninteractive; apt-get update -qq &&
             apt-get install -y -qq --no-install-recommends make gcc libc6-dev >/dev/null &&
             echo "installed: $(dpkg-query -W -f "\${Package} " make gcc libc6-dev)";
             for p in libopenmpi-dev libcriterion-dev g++ clang; do
                 dpkg-query -W "$p" >/dev/null 2>&1 && { echo "unexpected: $p is there"; exit 1; }
             done; echo "no development packages beyond make and gcc"'
}

clean_clone() {
    rm -rf "$root/root/megatron_c"
    git clone --quiet --no-hardlinks "$repo" "$root/root/megatron_c"
    echo "cloned $(git -C "$root/root/megatron_c" log --oneline -1)"
}

first_command() {
    in_root 'cd /root/megatron_c &&
             make lab03 && mpirun --allow-run-as-root --oversubscribe -np 8 ./lab03'
}

second_command() {
    in_root 'cd /root/megatron_c && make test'
}

step "debootstrap --variant=minbase $release ($mirror)" bootstrap
mount_all
step "make and a C compiler (the README's prerequisites)" newcomer_tools
step "a clean clone of $(git -C "$repo" rev-parse --short HEAD)" clean_clone
step "make lab03 && mpirun --allow-run-as-root --oversubscribe -np 8 ./lab03" first_command
step "make test" second_command
echo "==== fresh-check: passed"
for t in "${times[@]}"; do echo "  $t"; done
