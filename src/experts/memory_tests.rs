//! Tests of `memory.rs`: the parsers on fixture texts, the reader on a
//! fixture file system, and the decisions on `Memory` values.

use super::*;
use std::collections::HashMap;

const GB: u64 = 1_000_000_000;

fn host() -> Memory {
    Memory::parse("MemTotal:  125000000 kB\nMemFree: 1 kB\nMemAvailable:   120000000 kB\n").unwrap()
}

/// A file system of fixture texts.
fn files(list: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
    let map: HashMap<PathBuf, String> = list.iter().map(|(p, t)| (PathBuf::from(p), t.to_string())).collect();
    move |p: &Path| map.get(p).cloned()
}

const MOUNTS_V2: &str =
    "25 30 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n\
    30 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n";

const STAT_V2: &str = "anon 1000000000\nfile 3000000000\nkernel 20000000\nshmem 500000000\n\
    inactive_anon 0\nactive_anon 1000000000\ninactive_file 2000000000\nactive_file 500000000\n";

#[test]
fn proc_cgroup_gives_the_v2_and_v1_memory_paths() {
    let hybrid = "9:name=systemd:/\n4:memory:/process_api/a9\n2:cpu,cpuacct:/x\n0::/\n";
    assert_eq!(
        parse_proc_cgroup(hybrid),
        (Some("/".to_string()), Some("/process_api/a9".to_string()))
    );
    assert_eq!(
        parse_proc_cgroup("0::/system.slice/docker-1.scope\n"),
        (Some("/system.slice/docker-1.scope".to_string()), None)
    );
    assert_eq!(
        parse_proc_cgroup("6:cpu,memory,io:/k8s/pod1\n").1.as_deref(),
        Some("/k8s/pod1")
    );
    for garbage in ["", "\n\n", "0::", "nonsense", "0::relative", "::::", "\u{0}\u{ff}"] {
        assert_eq!(parse_proc_cgroup(garbage), (None, None), "{garbage:?}");
    }
}

#[test]
fn mountinfo_gives_cgroup2_and_the_v1_memory_mount() {
    let text = "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
        32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
        41 31 0:38 / /sys/fs/cgroup/uni\\040fied rw,relatime - cgroup2 cgroup2 rw\n\
        broken line\n";
    let m = parse_mountinfo(text);
    assert_eq!(m.len(), 2);
    assert_eq!(m[0].root, "/docker/abc");
    assert_eq!(m[0].point, PathBuf::from("/sys/fs/cgroup/memory"));
    assert_eq!(m[0].version, CgroupVersion::V1);
    assert_eq!(m[1].point, PathBuf::from("/sys/fs/cgroup/uni fied"));
    assert_eq!(m[1].version, CgroupVersion::V2);
    assert!(parse_mountinfo("a - b\n - \n1 2 3 4 - cgroup2\n").is_empty());
}

#[test]
fn group_dirs_sit_below_the_mount_point() {
    let m = |root: &str| CgroupMount {
        root: root.into(),
        point: PathBuf::from("/sys/fs/cgroup"),
        version: CgroupVersion::V2,
    };
    assert_eq!(group_dir(&m("/"), "/a/b"), PathBuf::from("/sys/fs/cgroup/a/b"));
    assert_eq!(group_dir(&m("/"), "/"), PathBuf::from("/sys/fs/cgroup"));
    assert_eq!(
        group_dir(&m("/docker/abc"), "/docker/abc"),
        PathBuf::from("/sys/fs/cgroup")
    );
    assert_eq!(
        group_dir(&m("/docker/abc"), "/docker/abc/x"),
        PathBuf::from("/sys/fs/cgroup/x")
    );
    // Not below the root (a namespace): the mount point itself.
    assert_eq!(
        group_dir(&m("/docker/abc"), "/docker/abcd"),
        PathBuf::from("/sys/fs/cgroup")
    );
    assert_eq!(group_dir(&m("/docker/abc"), "/"), PathBuf::from("/sys/fs/cgroup"));
    assert_eq!(group_dir(&m("/"), "/../sibling"), PathBuf::from("/sys/fs/cgroup"));
}

#[test]
fn limits_parse_from_the_group_files() {
    assert_eq!(parse_limit(CgroupVersion::V2, "max\n", Some("5\n"), None), None);
    let l = parse_limit(CgroupVersion::V2, "16000000000\n", Some("4000000000\n"), Some(STAT_V2)).unwrap();
    assert_eq!((l.limit, l.usage, l.reclaimable), (16 * GB, 4 * GB, 2_500_000_000));
    assert_eq!(l.room(), 14_500_000_000);
    assert_eq!(l.to_string(), "cgroup memory.max 16.0 GB");
    // Without the LRU counts, all page cache.
    let l = parse_limit(
        CgroupVersion::V2,
        "16000000000",
        Some("4000000000"),
        Some("file 1000\n"),
    )
    .unwrap();
    assert_eq!(l.reclaimable, 1000);
    // v1: the huge value is no limit; hierarchical counts first.
    let v1_stat = "cache 10\ninactive_file 1\nactive_file 2\ntotal_inactive_file 30\ntotal_active_file 40\n";
    assert_eq!(
        parse_limit(
            CgroupVersion::V1,
            "9223372036854771712\n",
            Some("3747840"),
            Some(v1_stat)
        ),
        None
    );
    let l = parse_limit(CgroupVersion::V1, "600000000\n", Some("100\n"), Some(v1_stat)).unwrap();
    assert_eq!((l.limit, l.usage, l.reclaimable), (600_000_000, 100, 70));
    assert_eq!(l.to_string(), "cgroup memory.limit_in_bytes 600 MB");
    // Missing or garbled usage and stat: the limit still counts.
    let l = parse_limit(CgroupVersion::V2, "1000", Some("garbage"), Some("\u{0}x y\n\n")).unwrap();
    assert_eq!((l.usage, l.reclaimable, l.room()), (0, 0, 1000));
    for bad in ["", "-1", "12 GB", "max max", "1e9", "\u{0}", "99999999999999999999999"] {
        assert_eq!(parse_limit(CgroupVersion::V2, bad, None, None), None, "{bad:?}");
        assert_eq!(parse_limit(CgroupVersion::V1, bad, None, None), None, "{bad:?}");
    }
}

#[test]
fn room_is_bounded() {
    let l = |limit, usage, reclaimable| CgroupLimit {
        version: CgroupVersion::V2,
        limit,
        usage,
        reclaimable,
    };
    // Over the limit (v1 allows it for a moment): nothing but the cache.
    assert_eq!(l(10, 15, 3).room(), 3);
    // More "reclaimable" than charged: at most the usage comes back.
    assert_eq!(l(10, 4, 9).room(), 10);
    assert_eq!(l(u64::MAX, 0, u64::MAX).room(), u64::MAX);
}

#[test]
fn v2_reads_the_own_group_and_its_ancestors() {
    let read = files(&[
        ("/proc/self/cgroup", "0::/kubepods/pod1/ctr\n"),
        ("/proc/self/mountinfo", MOUNTS_V2),
        ("/sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "max\n"),
        ("/sys/fs/cgroup/kubepods/pod1/ctr/memory.current", "3000000000\n"),
        ("/sys/fs/cgroup/kubepods/pod1/memory.max", "16000000000\n"),
        ("/sys/fs/cgroup/kubepods/pod1/memory.current", "4000000000\n"),
        ("/sys/fs/cgroup/kubepods/pod1/memory.stat", STAT_V2),
        ("/sys/fs/cgroup/kubepods/memory.max", "64000000000\n"),
        ("/sys/fs/cgroup/kubepods/memory.current", "60000000000\n"),
        // The root group has no memory.max.
        ("/sys/fs/cgroup/memory.current", "90000000000\n"),
    ]);
    let limits = cgroup_limits(&read);
    assert_eq!(limits.len(), 2);
    let mem = host().limited_by(&limits);
    // kubepods: 4 GB free (no stat); pod1: 12 + 2.5 GB.
    assert_eq!(mem.available, 4 * GB);
    assert_eq!(mem.total, 16 * GB);
    assert_eq!(mem.limit.unwrap().limit, 64 * GB);
    assert_eq!(mem.source(), "cgroup memory.max 64.0 GB");
    assert_eq!(mem.to_string(), "4.0 GB available under cgroup memory.max 64.0 GB");
    assert_eq!((mem.host_total, mem.host_available), (128 * GB, 122_880_000_000));
}

#[test]
fn v2_unlimited_and_missing_files_leave_the_host() {
    let read = files(&[
        ("/proc/self/cgroup", "0::/user.slice\n"),
        ("/proc/self/mountinfo", MOUNTS_V2),
        ("/sys/fs/cgroup/user.slice/memory.max", "max\n"),
    ]);
    assert!(cgroup_limits(&read).is_empty());
    let mem = host().limited_by(&cgroup_limits(&read));
    assert_eq!(mem, host());
    assert_eq!(mem.source(), "MemAvailable");
    assert_eq!(mem.to_string(), "122.9 GB MemAvailable");
    // Nothing readable at all, or garbage everywhere.
    assert!(cgroup_limits(&files(&[])).is_empty());
    let garbage = files(&[
        ("/proc/self/cgroup", "\u{0}::::\n0::/a\n"),
        ("/proc/self/mountinfo", "- - -\n1 2 3 / /sys/fs/cgroup - cgroup2\n"),
        ("/sys/fs/cgroup/a/memory.max", "lots\n"),
    ]);
    assert!(cgroup_limits(&garbage).is_empty());
}

#[test]
fn a_docker_v2_namespace_sees_its_own_limit_at_the_mount_point() {
    let read = files(&[
        ("/proc/self/cgroup", "0::/\n"),
        ("/proc/self/mountinfo", MOUNTS_V2),
        ("/sys/fs/cgroup/memory.max", "16000000000\n"),
        ("/sys/fs/cgroup/memory.current", "1000000000\n"),
    ]);
    let mem = host().limited_by(&cgroup_limits(&read));
    assert_eq!(mem.available, 15 * GB);
    assert_eq!(mem.total, 16 * GB);
    assert_eq!(mem.to_string(), "15.0 GB available under cgroup memory.max 16.0 GB");
}

#[test]
fn v1_is_read_through_the_memory_mount() {
    let mounts = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
        41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
    let read = files(&[
        ("/proc/self/cgroup", "4:memory:/process_api/a9\n0::/\n"),
        ("/proc/self/mountinfo", mounts),
        (
            "/sys/fs/cgroup/memory/process_api/a9/memory.limit_in_bytes",
            "600000000\n",
        ),
        (
            "/sys/fs/cgroup/memory/process_api/a9/memory.usage_in_bytes",
            "200000000\n",
        ),
        (
            "/sys/fs/cgroup/memory/process_api/a9/memory.stat",
            "total_inactive_file 50000000\ntotal_active_file 50000000\n",
        ),
        (
            "/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes",
            "9223372036854771712\n",
        ),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n"),
    ]);
    let mem = host().limited_by(&cgroup_limits(&read));
    assert_eq!(mem.available, 500_000_000);
    assert_eq!(mem.total, 600_000_000);
    assert_eq!(
        mem.to_string(),
        "500 MB available under cgroup memory.limit_in_bytes 600 MB"
    );
    // Without mountinfo, the usual mount points.
    let read = files(&[
        ("/proc/self/cgroup", "4:memory:/g\n"),
        ("/sys/fs/cgroup/memory/g/memory.limit_in_bytes", "600000000\n"),
    ]);
    assert_eq!(host().limited_by(&cgroup_limits(&read)).available, 600_000_000);
}

#[test]
fn a_loose_limit_does_not_bound_the_host() {
    let l = CgroupLimit {
        version: CgroupVersion::V2,
        limit: 500 * GB,
        usage: GB,
        reclaimable: 0,
    };
    let mem = host().limited_by(&[l]);
    assert_eq!((mem.total, mem.available), (host().total, host().available));
    assert_eq!(mem.limit, Some(l));
    assert_eq!(mem.source(), "MemAvailable");
}

#[test]
fn a_container_pins_all_but_an_eighth_a_host_half() {
    let limited = |limit: u64| {
        host().limited_by(&[CgroupLimit {
            version: CgroupVersion::V2,
            limit,
            usage: GB,
            reclaimable: 0,
        }])
    };
    let (b, why) = pin_budget(Some(&limited(16 * GB)));
    // 15 GB of room, of which 2 GiB (more than an eighth) stay unpinned.
    assert_eq!(b, 15 * GB - PIN_KEEP);
    assert_eq!(
        why,
        "all but 2.1 GB of the memory this process may use (15.0 GB available under cgroup memory.max 16.0 GB)"
    );
    // A larger container keeps an eighth.
    assert_eq!(pin_budget(Some(&limited(65 * GB))).0, 64 * GB - 8 * GB);
    // A container smaller than what it keeps pins nothing.
    assert_eq!(pin_budget(Some(&limited(2 * GB))).0, 0);
    // The host: half of MemAvailable.
    let (b, why) = pin_budget(Some(&host()));
    assert_eq!(b, host().available / 2);
    assert!(why.ends_with("(122.9 GB MemAvailable)"), "{why}");
    let (b, why) = pin_budget(None);
    assert_eq!(b, 0);
    assert!(why.contains("could not be read"));
}

#[test]
fn mangled_files_never_panic() {
    let seeds = [
        "4:memory:/process_api/a9\n0::/kubepods/pod1/ctr\n",
        MOUNTS_V2,
        "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n41 31 0:38 / /x\\040y rw - cgroup2 cgroup2 rw\n",
        STAT_V2,
        "16000000000\n",
    ];
    let pieces = [
        "\\", "\\0", "\\777", ":", " - ", "/", "..", "\n", "memory", "max", "é", "\u{0}", "0::",
    ];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    };
    for _ in 0..5000 {
        let mut t = seeds[next(seeds.len())].to_string();
        for _ in 0..1 + next(4) {
            let at = t
                .char_indices()
                .map(|(i, _)| i)
                .nth(next(t.chars().count() + 1))
                .unwrap_or(t.len());
            match next(3) {
                0 => t.insert_str(at, pieces[next(pieces.len())]),
                1 => t.truncate(at),
                _ => {
                    let end = t[at..].char_indices().nth(next(8)).map_or(t.len(), |(i, _)| at + i);
                    t.replace_range(at..end, "");
                }
            }
        }
        let _ = parse_proc_cgroup(&t);
        for m in parse_mountinfo(&t) {
            let _ = group_dir(&m, &t);
        }
        for v in [CgroupVersion::V1, CgroupVersion::V2] {
            let _ = parse_limit(v, &t, Some(&t), Some(&t));
        }
        let read = files(&[("/proc/self/cgroup", &t), ("/proc/self/mountinfo", &t)]);
        let _ = host().limited_by(&cgroup_limits(&read)).to_string();
    }
}

#[test]
fn proc_io_gives_the_bytes_read_from_storage() {
    let text =
        "rchar: 9000\nwchar: 10\nsyscr: 3\nsyscw: 1\nread_bytes: 4096\nwrite_bytes: 0\ncancelled_write_bytes: 0\n";
    assert_eq!(parse_storage_read(text), Some(4096));
    assert_eq!(parse_storage_read("rchar: 9000\n"), None);
    assert_eq!(parse_storage_read("read_bytes: x\n"), None);
}
