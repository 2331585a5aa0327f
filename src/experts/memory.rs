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

/// Bytes this process has caused to be fetched from storage
/// (`read_bytes` of `/proc/self/io`: page-cache misses and `O_DIRECT`
/// reads, not page-cache hits), or `None` where the file cannot be read.
pub fn storage_read_bytes() -> Option<u64> {
    parse_storage_read(&std::fs::read_to_string("/proc/self/io").ok()?)
}

/// `read_bytes` from the text of a `/proc/<pid>/io` file.
pub fn parse_storage_read(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
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

/// What a container's memory limit leaves unpinned at least: for the rest
/// of the process and the page cache of the expert files not pinned.
pub const PIN_KEEP: u64 = 2 << 30;

/// Bytes of expert files that may be pinned (registered with a GPU driver
/// as page-locked memory), and what set that. Pinned pages count against
/// the cgroup limit and cannot be reclaimed. Under a cgroup limit that
/// binds (a container's memory, set aside for this work): all of the room
/// but an eighth of it, at least [`PIN_KEEP`]. On a host: half of what is
/// available, the other half left to the rest of the machine.
pub fn pin_budget(mem: Option<&Memory>) -> (u64, String) {
    match mem {
        None => (0, "the memory this process may use could not be read".into()),
        Some(m) if m.limit.is_some_and(|l| l.room() < m.host_available) => {
            let keep = (m.available / 8).max(PIN_KEEP);
            (
                m.available.saturating_sub(keep),
                format!("all but {} of the memory this process may use ({m})", human_size(keep)),
            )
        }
        Some(m) => (m.available / 2, format!("half the memory this process may use ({m})")),
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
#[path = "memory_tests.rs"]
mod tests;
