# Memory cgroups for the larger-than-RAM benchmarks (sourced, not run):
# one cgroup per script run, v2 (/sys/fs/cgroup with the memory controller)
# or v1 (/sys/fs/cgroup/memory), no swap where v2 lets us say so.
#
#   cgroup_create NAME         makes $cg (NAME-PID), removed by cgroup_remove
#   cgroup_limit BYTES         sets (or changes) its memory limit
#   in_cgroup CMD...           runs CMD inside it (CGROUP_PIN: a command prefix, e.g. taskset -c 0,1)
#   evict PATH...              every file's pages out of the page cache, then the kernel's clean caches
#   cgroup_remove              removes it (call from the script's EXIT trap)
# Needs root; callers define die().

cgroup_create() {
    if grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
        cg=/sys/fs/cgroup/$1-$$
        cg_limit_file=memory.max
        echo +memory >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
        mkdir "$cg" || die "cannot create the cgroup $cg"
        echo 0 >"$cg/memory.swap.max" 2>/dev/null
    elif [ -d /sys/fs/cgroup/memory ]; then
        cg=/sys/fs/cgroup/memory/$1-$$
        cg_limit_file=memory.limit_in_bytes
        mkdir "$cg" || die "cannot create the cgroup $cg"
    else
        die "no memory cgroup controller (v2 /sys/fs/cgroup/cgroup.controllers or v1 /sys/fs/cgroup/memory)"
    fi
}

cgroup_limit() { echo "$1" >"$cg/$cg_limit_file" || die "cannot set the cgroup's limit to $1"; }

in_cgroup() { bash -c 'echo $BASHPID >"$0/cgroup.procs" && exec "$@"' "$cg" ${CGROUP_PIN[@]+"${CGROUP_PIN[@]}"} "$@"; }

evict() {
    sync
    for f in "$@"; do find "$f" -type f -exec dd if={} iflag=nocache count=0 status=none \;; done
    echo 1 >/proc/sys/vm/drop_caches
}

cgroup_remove() { if [ -n "${cg:-}" ]; then rmdir "$cg" 2>/dev/null || true; fi; }
