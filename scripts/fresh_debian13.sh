#!/usr/bin/env bash
# README's two commands on a fresh Debian 13 (trixie), with Debian's own Python 3.13:
#
#     scripts/fresh_debian13.sh [DIR] [-- PYTEST_ARGS...]   # as root; DIR defaults to /tmp/lm_ptb_trixie
#
# Debootstraps a minimal Debian 13 into DIR (a second run reuses it), copies
# this checkout's committed files into DIR/work/lm_ptb, and runs `make demo`
# and `make test` there in a chroot, as a new user of that system would.
# With `-- PYTEST_ARGS` it runs `make setup` and pytest on those arguments
# instead (e.g. `-- -q tests/test_slurm.py`): one test file under Open MPI 5
# without the whole suite; the copy's .venv then stays from the last run, and
# make setup checks it.
# PTB_DIR, when set, is copied in as the real PTB for the test that reads it.
# Needs root (debootstrap, chroot, mounts) and debootstrap (installed if missing).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
root=/tmp/lm_ptb_trixie
if [ $# -gt 0 ] && [ "$1" != -- ]; then root=$1; shift; fi
run='make demo && make test'
keep=()
if [ $# -gt 0 ]; then
    [ "$1" = -- ] && [ $# -gt 1 ] || { echo "fresh_debian13: usage: $0 [DIR] [-- PYTEST_ARGS...]" >&2; exit 2; }
    shift
    run="make setup && .venv/bin/python -m pytest ${*@Q}"
    keep=(! -name .venv)
fi

[ "$(id -u)" = 0 ] || { echo "fresh_debian13: run it as root (debootstrap, chroot and mounts need it)" >&2; exit 2; }
command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }

if [ ! -x "$root/usr/bin/python3" ]; then
    rm -rf "$root.tmp"
    debootstrap --variant=minbase --include=ca-certificates,git,make,python3,python3-venv,python3-dev \
        trixie "$root.tmp" http://deb.debian.org/debian
    mv "$root.tmp" "$root"
fi
# This machine's certificates and resolver: pip and apt inside must reach their mirrors as they do here.
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The host name on 127.0.1.1, as Debian's installer writes it (debootstrap writes no /etc/hosts):
# Gloo resolves it.
printf '127.0.0.1 localhost\n127.0.1.1 %s\n::1 localhost ip6-localhost ip6-loopback\n' "$(hostname)" >"$root/etc/hosts"

mounted=()
cleanup() {
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
# The root a mount of its own: `ip netns exec` (the tests' namespace hosts) remounts
# "/" as a slave, which fails on a folder that is no mount point.
mount --bind "$root" "$root" && mounted+=("$root")
mount -t proc proc "$root/proc" && mounted+=("$root/proc")
# /sys with the mounts below it, as a system has them (slurmd, in the Slurm tests, needs the
# cgroup file system at /sys/fs/cgroup); a slave copy, so that nothing unmounted in the root
# reaches this machine's own.
mkdir -p "$root/sys"
mount --rbind /sys "$root/sys" && mounted+=("$root/sys") && mount --make-rslave "$root/sys"
for dir in dev dev/pts run; do
    mkdir -p "$root/$dir"
    mount --bind "/$dir" "$root/$dir" && mounted+=("$root/$dir")
done

mkdir -p "$root/work/lm_ptb"
find "$root/work/lm_ptb" -mindepth 1 -maxdepth 1 "${keep[@]}" -exec rm -rf {} +
git -C "$here" archive --prefix=lm_ptb/ HEAD | tar -x -C "$root/work"
if [ -n "${PTB_DIR:-}" ]; then
    mkdir -p "$root/work/shared/data" && cp -r "$PTB_DIR" "$root/work/shared/data/ptb"
fi
chroot "$root" /bin/bash -c "cd /work/lm_ptb && python3 --version && $run"
