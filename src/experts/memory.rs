//! How much memory this process may use: the machine's (`/proc/meminfo`)
//! and the limits of its control group (cgroup v2 `memory.max`, v1
//! `memory.limit_in_bytes`), its own group's and every ancestor's, since
//! a parent's limit holds its children too. Containers (Docker,
//! Kubernetes) set such a limit while `/proc/meminfo` still shows the
//! host. Every parser takes the text of a file, and the reader takes a
//! function that reads files, so that both are tested on fixtures.

use std::path::{Path, PathBuf};

/// What this process may use, in bytes: the machine's memory, bounded by
/// the tightest cgroup limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// The most the process may hold: `MemTotal`, or a cgroup limit
    /// when lower.
    pub total: u64,
    /// What it may still take: `MemAvailable`, or the room under a
    /// cgroup limit ([`CgroupLimit::room`]) when less.
    pub available: u64,
    /// `MemTotal` and `MemAvailable` as `/proc/meminfo` gives them.
    pub host_total: u64,
    pub host_available: u64,
    /// The cgroup limit that leaves the least room, if any group on the
    /// way to the root has one.
    pub limit: Option<CgroupLimit>,
}

/// Which cgroup interface a limit was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// The memory limit of one control group and what is charged to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLimit {
    pub version: CgroupVersion,
    /// `memory.max` (v2) or `memory.limit_in_bytes` (v1).
    pub limit: u64,
    /// Charged to the group now: `memory.current` or
    /// `memory.usage_in_bytes` (0 where it cannot be read).
    pub usage: u64,
    /// Of that, page cache the kernel can give back before it kills:
    /// `inactive_file + active_file` of `memory.stat`.
    pub reclaimable: u64,
}

impl CgroupLimit {
    /// What the group may still take: the limit less what is charged,
    /// plus the reclaimable page cache (never more than the limit).
    pub fn room(&self) -> u64 {
        let free = self.limit.saturating_sub(self.usage);
        free.saturating_add(self.reclaimable.min(self.usage)).min(self.limit)
    }

    /// The name of the file that sets the limit.
    pub fn file(&self) -> &'static str {
        match self.version {
            CgroupVersion::V1 => "memory.limit_in_bytes",
            CgroupVersion::V2 => "memory.max",
        }
    }
}

impl std::fmt::Display for CgroupLimit {
    /// `cgroup memory.max 16.0 GB`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cgroup {} {}", self.file(), human_size(self.limit))
    }
}

/// `950 MB`, `16.0 GB` (decimal units, as the rest of the output).
pub fn human_size(n: u64) -> String {
    if n < 1_000_000_000 {
        format!("{:.0} MB", n as f64 / 1e6)
    } else {
        format!("{:.1} GB", n as f64 / 1e9)
    }
}

impl Memory {
    /// This process's, or `None` where `/proc/meminfo` cannot be read.
    /// The cgroup files are read as well; where they are missing or
    /// unreadable, only the machine's memory counts.
    pub fn read() -> Option<Memory> {
        let read = |p: &Path| std::fs::read_to_string(p).ok();
        let host = Memory::parse(&read(Path::new("/proc/meminfo"))?)?;
        Some(host.limited_by(&cgroup_limits(&read)))
    }

    /// From the text of `/proc/meminfo` alone (no cgroup limit).
    pub fn parse(text: &str) -> Option<Memory> {
        let kb = |key: &str| -> Option<u64> {
            let line = text.lines().find(|l| l.starts_with(key))?;
            line[key.len()..]
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()?
                .checked_mul(1024)
        };
        let (total, available) = (kb("MemTotal:")?, kb("MemAvailable:")?);
        Some(Memory {
            total,
            available,
            host_total: total,
            host_available: available,
            limit: None,
        })
    }

    /// The machine's memory of `self` bounded by the cgroup `limits`.
    pub fn limited_by(self, limits: &[CgroupLimit]) -> Memory {
        let tightest = limits.iter().min_by_key(|l| l.room()).copied();
        let lowest = limits.iter().map(|l| l.limit).min().unwrap_or(u64::MAX);
        Memory {
            total: self.host_total.min(lowest),
            available: self.host_available.min(tightest.map_or(u64::MAX, |l| l.room())),
            host_total: self.host_total,
            host_available: self.host_available,
            limit: tightest,
        }
    }

    /// What bounds [`Memory::available`]: the cgroup limit (`cgroup
    /// memory.max 16.0 GB`) when its room is the smaller, else
    /// `MemAvailable`.
    pub fn source(&self) -> String {
        match self.limit {
            Some(l) if l.room() < self.host_available => l.to_string(),
            _ => "MemAvailable".to_string(),
        }
    }
}

impl std::fmt::Display for Memory {
    /// `14.9 GB available under cgroup memory.max 16.0 GB`, or
    /// `120.3 GB MemAvailable`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.limit {
            Some(l) if l.room() < self.host_available => {
                write!(f, "{} available under {l}", human_size(self.available))
            }
            _ => write!(f, "{} MemAvailable", human_size(self.available)),
        }
    }
}

/// Why expert files of `expert_bytes` may not be pinned (registered with
/// a GPU driver as page-locked memory), or `None` when they may: pinned
/// pages count against the cgroup limit and cannot be reclaimed, so they
/// must fit in half of what the process may still use (the other half
/// is left to everything else it holds, the page cache included).
pub fn pin_refusal(expert_bytes: u64, mem: Option<&Memory>) -> Option<String> {
    match mem {
        None => Some("the memory this process may use could not be read".into()),
        Some(m) if expert_bytes > m.available / 2 => Some(format!(
            "the expert files ({}) are over half the memory this process may use ({m})",
            human_size(expert_bytes)
        )),
        Some(_) => None,
    }
}

/// The v2 path (`0::/path`) and the v1 memory controller's path
/// (`4:memory:/path`) of `/proc/self/cgroup`.
pub fn parse_proc_cgroup(text: &str) -> (Option<String>, Option<String>) {
    let (mut v2, mut v1) = (None, None);
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(ctrl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if !path.starts_with('/') {
            continue;
        }
        if id == "0" && ctrl.is_empty() {
            v2 = Some(path.to_string());
        } else if ctrl.split(',').any(|c| c == "memory") {
            v1 = Some(path.to_string());
        }
    }
    (v2, v1)
}

/// A cgroup filesystem mounted: the group at its root, where it is
/// mounted, and which interface it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    pub root: String,
    pub point: PathBuf,
    pub version: CgroupVersion,
}

/// The cgroup v2 mounts and the v1 mounts of the memory controller in
/// the text of `/proc/self/mountinfo`.
pub fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    let mut mounts = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        let (Some(root), Some(point), Some(fstype)) = (l.get(3), l.get(4), r.first()) else {
            continue;
        };
        let version = match *fstype {
            "cgroup2" => CgroupVersion::V2,
            "cgroup" if r.get(2).is_some_and(|o| o.split(',').any(|c| c == "memory")) => CgroupVersion::V1,
            _ => continue,
        };
        mounts.push(CgroupMount {
            root: unescape(root),
            point: PathBuf::from(unescape(point)),
            version,
        });
    }
    mounts
}

/// Undo mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match oct {
            Some(d) => {
                out.push(d.iter().fold(0u8, |a, c| a.wrapping_mul(8).wrapping_add(c - b'0')));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directory of the group at `path` under `mount`: the mount point
/// plus the part of `path` below the mount's root (the mount point
/// itself where `path` is not below it, as inside a cgroup namespace).
pub fn group_dir(mount: &CgroupMount, path: &str) -> PathBuf {
    let root = mount.root.trim_end_matches('/');
    let rel = match path.strip_prefix(root) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
        _ => "",
    };
    let rel = rel.trim_start_matches('/');
    // `/../sibling` (a group outside this namespace's root): not reachable here.
    if rel.is_empty() || rel.split('/').any(|c| c == "..") {
        mount.point.clone()
    } else {
        mount.point.join(rel)
    }
}

/// v1 reports "no limit" as the largest page-aligned `i64`; anything from
/// 2^62 bytes up is taken to mean the same.
const V1_UNLIMITED: u64 = 1 << 62;

/// One group's limit from the text of its files: `limit` is `memory.max`
/// (v2: a number or `max`) or `memory.limit_in_bytes` (v1), `usage`
/// `memory.current` or `memory.usage_in_bytes`, `stat` `memory.stat`.
/// `None` when the group has no limit or the limit does not parse.
pub fn parse_limit(
    version: CgroupVersion,
    limit: &str,
    usage: Option<&str>,
    stat: Option<&str>,
) -> Option<CgroupLimit> {
    let limit: u64 = limit.trim().parse().ok()?;
    if version == CgroupVersion::V1 && limit >= V1_UNLIMITED {
        return None;
    }
    let usage = usage.and_then(|u| u.trim().parse::<u64>().ok()).unwrap_or(0);
    let reclaimable = stat.map_or(0, |s| reclaimable(version, s));
    Some(CgroupLimit {
        version,
        limit,
        usage,
        reclaimable,
    })
}

/// The page cache the kernel can reclaim, from `memory.stat`: the file
/// LRU lists (v1: the hierarchical `total_` counts where given), else
/// all page cache (`file`, v1 `cache`).
fn reclaimable(version: CgroupVersion, stat: &str) -> u64 {
    let get = |key: &str| -> Option<u64> {
        stat.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok()).flatten()
        })
    };
    let lru = |prefix: &str| -> Option<u64> {
        let i = get(&format!("{prefix}inactive_file"));
        let a = get(&format!("{prefix}active_file"));
        (i.is_some() || a.is_some()).then(|| i.unwrap_or(0).saturating_add(a.unwrap_or(0)))
    };
    let found = match version {
        CgroupVersion::V2 => lru("").or_else(|| get("file")),
        CgroupVersion::V1 => lru("total_")
            .or_else(|| lru(""))
            .or_else(|| get("total_cache"))
            .or_else(|| get("cache")),
    };
    found.unwrap_or(0)
}

/// Where cgroups are mounted when `/proc/self/mountinfo` cannot be read.
fn default_mounts() -> Vec<CgroupMount> {
    let at = |point: &str, version| CgroupMount {
        root: "/".into(),
        point: PathBuf::from(point),
        version,
    };
    vec![
        at("/sys/fs/cgroup", CgroupVersion::V2),
        at("/sys/fs/cgroup/memory", CgroupVersion::V1),
    ]
}

/// Every memory limit on this process's groups, its own and their
/// ancestors' up to the mount point, v2 and v1 alike (a controller is in
/// one of the two); `read` gives a file's text, `None` where it cannot.
pub fn cgroup_limits(read: &dyn Fn(&Path) -> Option<String>) -> Vec<CgroupLimit> {
    let Some(own) = read(Path::new("/proc/self/cgroup")) else {
        return Vec::new();
    };
    let (v2, v1) = parse_proc_cgroup(&own);
    let mounts = read(Path::new("/proc/self/mountinfo")).map_or_else(default_mounts, |t| parse_mountinfo(&t));
    let mut limits = Vec::new();
    for m in &mounts {
        let (path, files) = match m.version {
            CgroupVersion::V2 => (&v2, ["memory.max", "memory.current"]),
            CgroupVersion::V1 => (&v1, ["memory.limit_in_bytes", "memory.usage_in_bytes"]),
        };
        let Some(path) = path else { continue };
        let mut dir = group_dir(m, path);
        loop {
            if let Some(text) = read(&dir.join(files[0])) {
                let usage = read(&dir.join(files[1]));
                let stat = read(&dir.join("memory.stat"));
                limits.extend(parse_limit(m.version, &text, usage.as_deref(), stat.as_deref()));
            }
            if dir == m.point || !dir.pop() || !dir.starts_with(&m.point) {
                break;
            }
        }
    }
    limits
}

#[cfg(test)]
mod tests {
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
    fn pinning_needs_half_of_what_the_process_may_use() {
        let limited = host().limited_by(&[CgroupLimit {
            version: CgroupVersion::V2,
            limit: 16 * GB,
            usage: GB,
            reclaimable: 0,
        }]);
        let why = pin_refusal(19_300_000_000, Some(&limited)).unwrap();
        assert_eq!(
            why,
            "the expert files (19.3 GB) are over half the memory this process may use (15.0 GB available under cgroup memory.max 16.0 GB)"
        );
        assert!(pin_refusal(7_500_000_000, Some(&limited)).is_none());
        assert!(pin_refusal(7_500_000_001, Some(&limited)).is_some());
        // The same files on the unlimited host are pinned.
        assert!(pin_refusal(19_300_000_000, Some(&host())).is_none());
        let why = pin_refusal(100 * GB, Some(&host())).unwrap();
        assert!(why.ends_with("(122.9 GB MemAvailable)"), "{why}");
        assert!(pin_refusal(1, None).unwrap().contains("could not be read"));
    }
}
