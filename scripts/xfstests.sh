#!/usr/bin/env bash
# fstests (xfstests) through jext4's mount helper, beside fuse2fs.
#
#   scripts/xfstests.sh [--fs jext4,fuse2fs] [--group NAME | TEST...]
#                       [--limit N] [--timeout SECONDS] [--size MIB]
#                       [--source DIR] [--cache DIR] [--out DIR]
#
# Opt-in (not part of scripts/test.sh): a full generic/quick run takes hours
# through FUSE. Needs root. What it does:
#  - installs fstests' build and run dependencies with apt-get when missing,
#    and builds fstests once in the cache (default /var/cache/jext4-xfstests):
#    from --source DIR (a checkout or unpacked snapshot) or else a clone of
#    its public repository at the pinned commit below;
#  - builds jext4 (release) and, in a private mount namespace, puts it in
#    /usr/local/bin, on the standard PATH mount(8) gives mount.fuse3, which
#    mounts `-t fuse.jext4` (and `-t fuse.fuse2fs`); nothing is installed;
#  - creates fstests' users (fsgqa, fsgqa2, 123456-fsgqa);
#  - runs each test on its own, for each filesystem, on fresh 1 KiB-block
#    ext4 images (TEST and SCRATCH, files in the cache), each test bounded
#    by --timeout (default 300 s; a test past it counts as "timeout");
#  - after each test, unmounts and runs `e2fsck -fn` on both images:
#    fstests cannot check a FUSE filesystem itself (common/rc: "no way to
#    check consistency for fuse"), so an image e2fsck finds damaged turns
#    the test's verdict into "fsck" whatever fstests said;
#  - prints a table (test, verdict per filesystem) and writes it with each
#    failure's output under --out (default /var/tmp/jext4-xfstests/results).
#
# Verdicts: pass, fail (fstests' verdict; the .out.bad diff is kept),
# notrun (the test said why: kept in the table's notes), timeout, fsck.
set -euo pipefail

# The fstests commit the figures in docs/testing.md were measured with.
FSTESTS_REPO=${FSTESTS_REPO:-https://git.kernel.org/pub/scm/fs/xfs/xfstests-dev.git}
FSTESTS_COMMIT=${FSTESTS_COMMIT:-63a29724a85f1999e49bf0a9bf0d22643b6116e5}

# mount(8) runs mount.fuse3, and so `jext4`, with the standard PATH only.
# So that nothing is installed on the machine, the run happens in a private
# mount namespace where /usr/local/bin is a directory holding jext4 (its
# mounts are invisible outside and go with the namespace).
if [ "$(id -u)" -eq 0 ] && [ -z "${JEXT4_XFSTESTS_NS:-}" ]; then
    exec unshare -m --propagation private env JEXT4_XFSTESTS_NS=1 "$0" "$@"
fi

here=$(cd "$(dirname "$0")/.." && pwd)
filesystems=jext4,fuse2fs
group=
tests=()
limit=0
per_test_timeout=300
size_mib=1024
source_dir=
cache=/var/cache/jext4-xfstests
out=/var/tmp/jext4-xfstests/results

usage() { sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
    case $1 in
        --fs) filesystems=$2; shift 2 ;;
        --group) group=$2; shift 2 ;;
        --limit) limit=$2; shift 2 ;;
        --timeout) per_test_timeout=$2; shift 2 ;;
        --size) size_mib=$2; shift 2 ;;
        --source) source_dir=$2; shift 2 ;;
        --cache) cache=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        -h|--help) usage ;;
        -*) echo "xfstests.sh: unknown option $1" >&2; usage 2 ;;
        *) tests+=("$1"); shift ;;
    esac
done
if [ ${#tests[@]} -eq 0 ] && [ -z "$group" ]; then group=quick; fi
for fs in ${filesystems//,/ }; do
    case $fs in jext4|fuse2fs) ;; *) echo "xfstests.sh: --fs: jext4 or fuse2fs, not $fs" >&2; exit 2 ;; esac
done
[ "$(id -u)" -eq 0 ] || { echo "xfstests.sh: needs root (mounts, users)" >&2; exit 2; }

# --- dependencies -----------------------------------------------------------
packages=(acl attr autoconf automake bc dbench e2fsprogs fio fuse3 fuse2fs gawk gcc
    gettext git indent libacl1-dev libaio-dev libcap-dev libgdbm-compat-dev libgdbm-dev
    libtool libtool-bin liburing-dev make pkg-config psmisc python3 quota sed sqlite3
    uuid-dev uuid-runtime xfsprogs xfslibs-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "xfstests.sh: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "xfstests.sh: cargo is missing (see README)" >&2; exit 2; }

# --- fstests, built once ----------------------------------------------------
src=$cache/src
if [ ! -x "$src/check" ] || [ ! -e "$src/ltp/fsstress" ]; then
    rm -rf "$src"
    mkdir -p "$cache"
    if [ -n "$source_dir" ]; then
        if [ -d "$source_dir/.git" ] || git -C "$source_dir" rev-parse --git-dir >/dev/null 2>&1; then
            git -C "$source_dir" archive "$(git -C "$source_dir" rev-parse HEAD)" | (mkdir -p "$src" && tar -x -C "$src")
        else
            cp -a "$source_dir" "$src"
        fi
    else
        git clone --quiet "$FSTESTS_REPO" "$src"
        git -C "$src" checkout --quiet "$FSTESTS_COMMIT"
    fi
    echo "xfstests.sh: building fstests in $src"
    make -C "$src" -j"$(nproc)" >"$cache/build.log" 2>&1 ||
        { echo "xfstests.sh: fstests build failed, see $cache/build.log" >&2; exit 1; }
fi

# fstests compares the type df shows with $FSTYP, and maps some FUSE
# types back for that (fuse.glusterfs, fuse.ceph-fuse) but not ours: a
# mount made with `-t fuse.jext4` shows as fuse.jext4, and every test stops
# at "TEST_DEV ... is mounted but not a type fuse filesystem". Map any
# fuse.SUBTYPE to fuse in the cached copy (idempotent).
if ! grep -q 'jext4: fuse subtypes' "$src/common/rc"; then
    # shellcheck disable=SC2016
    sed -i '/-e .s\/fuse.ceph-fuse\/ceph-fuse\/./s/$/ | sed -e "s\/^fuse\\..*\/fuse\/" # jext4: fuse subtypes/' \
        "$src/common/rc"
fi

# --- jext4 on mount's PATH --------------------------------------------------
(cd "$here" && cargo build --release --quiet --bin jext4)
bin=$cache/bin
mkdir -p "$bin"
ln -sf "$here/target/release/jext4" "$bin/jext4"
mount --bind "$bin" /usr/local/bin
# The namespace began with a copy of every mount. A copy of someone else's
# FUSE or loop mount would keep that filesystem alive after its owner
# unmounts it (the FUSE server never hears DESTROY, the loop device stays
# busy) for as long as this run lasts: detach the copies, here only.
findmnt -rn -o TARGET,FSTYPE,SOURCE | awk '$2 ~ /^fuse(\.|blk|$)/ || $3 ~ /^\/dev\/loop/ { print $1 }' |
    sort -r | while read -r target; do umount -l "$(printf '%b' "$target")" 2>/dev/null || true; done

for user in fsgqa fsgqa2 123456-fsgqa; do
    id "$user" >/dev/null 2>&1 || useradd -m "$user"
done
getent group fsgqa >/dev/null || groupadd fsgqa

# --- the run ----------------------------------------------------------------
work=$cache/run
mkdir -p "$work" "$out"
test_img=$work/test.img scratch_img=$work/scratch.img
test_mnt=$work/test scratch_mnt=$work/scratch
mkdir -p "$test_mnt" "$scratch_mnt"

unmount_all() {
    for m in "$test_mnt" "$scratch_mnt"; do
        if mountpoint -q "$m"; then
            umount "$m" 2>/dev/null || { sleep 1; umount "$m" 2>/dev/null; } || umount -l "$m" || true
        fi
    done
    # A FUSE server may still be writing back after umount returned.
    for _ in $(seq 50); do
        pgrep -f "$work/(test|scratch).img" >/dev/null || break
        sleep 0.2
    done
}
trap unmount_all EXIT

fresh_images() {
    for img in "$test_img" "$scratch_img"; do
        rm -f "$img"
        truncate -s "${size_mib}M" "$img"
        mkfs.ext4 -q -F -b 1024 "$img"
    done
}

list=("${tests[@]}")
if [ -n "$group" ]; then
    mapfile -t list < <(awk -v g="$group" '$0 !~ /^#/ { for (i = 2; i <= NF; i++) if ($i == g) print "generic/" $1 }' \
        "$src/tests/generic/group.list")
fi
if [ "$limit" -gt 0 ] && [ ${#list[@]} -gt "$limit" ]; then list=("${list[@]:0:$limit}"); fi
[ ${#list[@]} -gt 0 ] || { echo "xfstests.sh: no tests selected" >&2; exit 2; }
echo "xfstests.sh: ${#list[@]} tests on ${filesystems//,/ and } (timeout ${per_test_timeout} s each)"

declare -A verdict note
for fs in ${filesystems//,/ }; do
    options="-oallow_other"
    cat >"$src/local.config" <<EOF
export FSTYP=fuse
export FUSE_SUBTYP=.$fs
export TEST_DEV=$test_img
export TEST_DIR=$test_mnt
export SCRATCH_DEV=$scratch_img
export SCRATCH_MNT=$scratch_mnt
export TEST_FS_MOUNT_OPTS="$options"
export MOUNT_OPTIONS="$options"
export RESULT_BASE=$work/results-$fs
EOF
    for t in "${list[@]}"; do
        unmount_all
        fresh_images
        log=$out/$fs/${t//\//-}
        mkdir -p "$out/$fs"
        set +e
        (cd "$src" && timeout -k 10 "$per_test_timeout" ./check -fuse "$t") >"$log.log" 2>&1
        status=$?
        set -e
        if [ $status -eq 124 ] || [ $status -eq 137 ]; then
            v=timeout
        elif grep -q "^Not run:" "$log.log"; then
            v=notrun
            note[$t,$fs]=$(grep -m1 -A0 "\[not run\]" "$log.log" | sed 's/.*\[not run\] *//' | cut -c1-70)
        elif grep -q "^Passed all" "$log.log"; then
            v=pass
        else
            v=fail
            cp "$work/results-$fs/$t.out.bad" "$log.out.bad" 2>/dev/null || true
            cp "$work/results-$fs/$t.full" "$log.full" 2>/dev/null || true
        fi
        unmount_all
        for img in "$test_img" "$scratch_img"; do
            if ! e2fsck -fn "$img" >"$log.fsck" 2>&1; then
                v=fsck
                cp "$img" "$log.$(basename "$img")" 2>/dev/null || true
                break
            fi
        done
        [ "$v" = fsck ] || rm -f "$log.fsck"
        verdict[$t,$fs]=$v
        printf '%-14s %-8s %s\n' "$t" "$fs" "$v"
    done
done

# --- the table --------------------------------------------------------------
table=$out/table.md
{
    printf '| test |'; for fs in ${filesystems//,/ }; do printf ' %s |' "$fs"; done; printf ' notes |\n'
    printf '|---|'; for _ in ${filesystems//,/ }; do printf -- '---|'; done; printf -- '---|\n'
    for t in "${list[@]}"; do
        printf '| %s |' "$t"
        n=
        for fs in ${filesystems//,/ }; do
            printf ' %s |' "${verdict[$t,$fs]}"
            [ -n "${note[$t,$fs]:-}" ] && n="$n${n:+; }$fs: ${note[$t,$fs]}"
        done
        printf ' %s |\n' "$n"
    done
    echo
    for fs in ${filesystems//,/ }; do
        printf '%s:' "$fs"
        for v in pass fail notrun timeout fsck; do
            c=0
            for t in "${list[@]}"; do [ "${verdict[$t,$fs]}" = "$v" ] && c=$((c + 1)); done
            printf ' %s %d' "$v" "$c"
        done
        echo
    done
} >"$table"
tail -n "$(echo "${filesystems//,/ }" | wc -w)" "$table"
echo "xfstests.sh: table in $table; failures' output beside it"
