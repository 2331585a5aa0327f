#!/bin/sh
# Run a command in a new memory cgroup, as Docker's --memory or a
# Kubernetes memory limit would: the kernel's OOM killer acts at LIMIT,
# whatever /proc/meminfo says. Needs root (it writes /sys/fs/cgroup).
#
#   tools/memlimit.sh 16G target/release/moeflux bench --model M --device cuda --expert-cache 25%
#
# LIMIT takes the kernel's suffixes (K, M, G). On cgroup v2 the group is
# made at the top of the hierarchy (v2 allows no processes in a group
# that hands controllers to its children), on v1 below the caller's own
# memory group, so the caller's limits still hold. After the command the
# group's peak usage and OOM-kill count are printed on stderr and the
# group is removed. The exit status is the command's.
set -eu
[ $# -ge 2 ] || { echo "usage: $0 LIMIT COMMAND [ARGS...]" >&2; exit 2; }
limit=$1
shift
name=moeflux-memlimit-$$

v1_path=$(sed -n 's/^[0-9]*:\([^:]*,\)\{0,1\}memory\(,[^:]*\)\{0,1\}:\(.*\)$/\3/p' /proc/self/cgroup)
if [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
    root=/sys/fs/cgroup
    grep -qw memory $root/cgroup.subtree_control || echo +memory > $root/cgroup.subtree_control
    g=$root/$name
    mkdir "$g"
    echo "$limit" > "$g/memory.max"
    [ -f "$g/memory.swap.max" ] && echo 0 > "$g/memory.swap.max"
    version=2
elif [ -n "$v1_path" ] && [ -d /sys/fs/cgroup/memory ]; then
    g=/sys/fs/cgroup/memory${v1_path%/}/$name
    mkdir "$g"
    echo "$limit" > "$g/memory.limit_in_bytes"
    version=1
else
    echo "$0: no cgroup memory controller found under /sys/fs/cgroup" >&2
    exit 1
fi
echo "memlimit: cgroup v$version $g, limit $limit" >&2

status=0
sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' memlimit "$g" "$@" || status=$?

if [ $version = 2 ]; then
    peak=$(cat "$g/memory.peak" 2>/dev/null || echo unknown)
    kills=$(sed -n 's/^oom_kill //p' "$g/memory.events")
else
    peak=$(cat "$g/memory.max_usage_in_bytes")
    kills=$(sed -n 's/^oom_kill //p' "$g/memory.oom_control")
fi
echo "memlimit: exit status $status, peak $peak bytes, oom_kill ${kills:-unknown}" >&2
# The command's page cache stays charged to the group until it is moved or dropped.
[ $version = 1 ] && echo 0 > "$g/memory.force_empty" 2>/dev/null || true
rmdir "$g" 2>/dev/null || echo "memlimit: could not remove $g" >&2
exit $status
