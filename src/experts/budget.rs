//! How much device memory an expert cache may take ([`CacheSize`], as the
//! `--expert-cache` flag gives it), how many slots that makes, and the
//! counters a cache reports ([`CacheStats`]): plain Rust, the same for any
//! backend that keeps a device expert cache.

use crate::error::{Error, Result};

/// How much memory a cache of experts may take: the device's expert
/// cache (`--expert-cache`), or the RAM tier (`--ram-cache`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum CacheSize {
    /// The free device memory after the dense weights, less a margin.
    #[default]
    Auto,
    Bytes(u64),
    /// A percentage of all the experts' bytes.
    Percent(f64),
}

impl std::str::FromStr for CacheSize {
    type Err = Error;
    /// `auto`, `25%`, `8G`, `512M`, `1.5GiB`, `123456` (bytes).
    fn from_str(s: &str) -> Result<CacheSize> {
        let t = s.trim();
        let bad = || {
            Error::Invalid(format!(
                "cache size `{s}`: expected auto, a percentage (25%) or a size (8G, 512M)"
            ))
        };
        if t.eq_ignore_ascii_case("auto") {
            return Ok(CacheSize::Auto);
        }
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p.trim().parse().map_err(|_| bad())?;
            if !(0.0..=100.0).contains(&v) {
                return Err(Error::Invalid(format!(
                    "cache size `{s}`: a share of the expert bytes is from 0% to 100%"
                )));
            }
            return Ok(CacheSize::Percent(v));
        }
        let lower = t.to_ascii_lowercase();
        let num_end = lower
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(lower.len());
        let (num, unit) = lower.split_at(num_end);
        let v: f64 = num.parse().map_err(|_| bad())?;
        let mult = match unit.trim() {
            "" | "b" => 1.0,
            "k" | "kb" | "kib" => 1024.0,
            "m" | "mb" | "mib" => 1024.0 * 1024.0,
            "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
            "t" | "tb" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            _ => return Err(bad()),
        };
        Ok(CacheSize::Bytes((v * mult) as u64))
    }
}

/// What a [`CacheSize`] is turned into slots with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SlotBudget {
    /// Bytes of one slot (the largest expert, rounded up).
    pub slot_bytes: u64,
    /// Experts of all the MoE layers, and their bytes.
    pub experts: usize,
    pub expert_bytes: u64,
    /// The smallest working set: one layer's active experts (K; 2K with
    /// prefetch, for the next layer's guessed experts), so that
    /// a token's experts of a layer are copied and computed in one go.
    pub min_slots: usize,
    /// Device memory the cache may take.
    pub room: u64,
}

impl CacheSize {
    /// The number of slots, and whether the size was raised to the
    /// smallest working set (`0`, `0%`, or a size smaller than it).
    pub(crate) fn slots(self, b: &SlotBudget) -> Result<(usize, bool)> {
        let budget = match self {
            CacheSize::Auto => b.room,
            CacheSize::Bytes(n) => n,
            CacheSize::Percent(p) => (b.expert_bytes as f64 * p / 100.0) as u64,
        };
        let min = b.min_slots.clamp(1, b.experts.max(1));
        let fit = (budget / b.slot_bytes.max(1)).min(b.experts as u64) as usize;
        let slots = fit.max(min);
        let gb = |n: u64| n as f64 / 1e9;
        if slots as u64 * b.slot_bytes > b.room {
            return Err(Error::Invalid(format!(
                "an expert cache of {} experts ({:.2} GB{}) does not fit: {:.2} GB of device memory is free for it (free memory less a margin)",
                slots,
                gb(slots as u64 * b.slot_bytes),
                if fit < min { ", the smallest working set" } else { "" },
                gb(b.room)
            )));
        }
        Ok((slots, fit < min))
    }
}

/// The parts of a streamed decode step's MoE layer, from its routing to
/// the next layer's, as `CacheStats::layer_parts_ns` counts them. The
/// fourth is the host's work after the experts are queued: queuing the
/// next layer's guesses (where expert files are read into staging
/// buffers, not registered with the driver: a memory limit, the staging
/// thread reads them meanwhile, and the next step's first part waits
/// for those reads; there the CPU's share is waited for too). The fifth
/// holds the GPU's wait for the CPU's share, whose sum is added after
/// the combine; the sixth the rest of the layer and the next one's
/// dense part up to its routing.
pub const LAYER_PARTS: [&str; 6] = [
    "ids to the host, copies issued",
    "wait for the copies",
    "GPU experts",
    "wait for the host (reads ahead)",
    "combine, the CPU's sum (and the wait for it)",
    "on to the next routing",
];

/// Router guess ranks counted one by one in [`CacheStats::rank_copied`]
/// (the best first; a later rank is not counted).
pub const GUESS_RANKS: usize = 8;

/// Counters of the expert cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Expert lookups found in a slot.
    pub hits: u64,
    /// Expert lookups that had to be copied from the host.
    pub misses: u64,
    /// Misses (and guesses) copied into a probation slot instead of over
    /// a cached expert wanted more often (`experts::cache`).
    pub bypassed: u64,
    /// Experts copied ahead of need by prefetch.
    pub prefetched: u64,
    /// Hits on a slot that prefetch had filled.
    pub prefetch_hits: u64,
    /// Bytes copied host→device.
    pub bytes_copied: u64,
    /// Misses computed on the CPU from host memory instead of copied
    /// (`--hybrid`), and their bytes.
    pub on_host: u64,
    pub bytes_on_host: u64,
    /// Host time the thread driving the GPU spends on misses and
    /// prefetches: issuing the copies, and where the files are not
    /// registered with the driver, queuing them for the staging thread
    /// and waiting, before a step's experts launch, until it has read
    /// and issued every copy queued so far (its reads count only while
    /// this thread waits for them).
    pub stall_ns: u64,
    /// CPU steps of split misses, the CPU's time in them, and the steps
    /// in which the GPU's share had finished before the CPU's (the CPU
    /// was the step's last).
    pub host_steps: u64,
    pub host_ns: u64,
    pub host_last: u64,
    /// Router guesses made for the next layer, and the experts of them
    /// copied ahead (all but where `--hybrid auto` tunes the count).
    pub hints: u64,
    pub guesses: u64,
    /// Of the router's guesses copied ahead, by rank (0: the router's
    /// best; [`GUESS_RANKS`] ranks counted): how many were copied, and
    /// how many a step then used before they were evicted.
    pub rank_copied: [u64; GUESS_RANKS],
    pub rank_used: [u64; GUESS_RANKS],
    /// Of the experts a layer used at one token, how many it used again
    /// at the next (one-token steps; the last token's experts are copied
    /// ahead only while the share is high, `experts::repeats`).
    pub repeat_seen: u64,
    pub repeat_again: u64,
    /// With `trace_layers` (CUDA, for measuring): nanoseconds of the GPU's
    /// time in each part of a streamed decode step's MoE layer
    /// ([`LAYER_PARTS`]), summed over `layer_steps` steps.
    pub layer_parts_ns: [u64; LAYER_PARTS.len()],
    pub layer_steps: u64,
    /// With `trace_layers`: the host's nanoseconds, over the same steps,
    /// from a step's ids to its copies issued (planning), and from there
    /// to the next step's routing (issuing launches).
    pub layer_host_ns: [u64; 2],
    pub slots: u64,
    /// Every expert of the model is in a slot.
    pub resident: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!("auto".parse::<CacheSize>().unwrap(), CacheSize::Auto);
        assert_eq!("25%".parse::<CacheSize>().unwrap(), CacheSize::Percent(25.0));
        assert_eq!("8G".parse::<CacheSize>().unwrap(), CacheSize::Bytes(8 << 30));
        assert_eq!("512M".parse::<CacheSize>().unwrap(), CacheSize::Bytes(512 << 20));
        assert_eq!("1.5GiB".parse::<CacheSize>().unwrap(), CacheSize::Bytes(3 << 29));
        assert_eq!("4096".parse::<CacheSize>().unwrap(), CacheSize::Bytes(4096));
        for bad in ["", "12Q", "150%", "-3G", "G"] {
            assert!(bad.parse::<CacheSize>().is_err(), "{bad} was accepted");
        }
        assert_eq!("0%".parse::<CacheSize>().unwrap(), CacheSize::Percent(0.0));
        assert_eq!("0".parse::<CacheSize>().unwrap(), CacheSize::Bytes(0));
        let e = "200%".parse::<CacheSize>().unwrap_err().to_string();
        assert!(e.contains("0%") && e.contains("100%"), "{e}");
    }

    /// 40 MoE layers × 256 experts of 1 MB, 8 active; 100 GB of room.
    const BUDGET: SlotBudget = SlotBudget {
        slot_bytes: 1 << 20,
        experts: 40 * 256,
        expert_bytes: (40 * 256) << 20,
        min_slots: 8,
        room: 100 << 30,
    };

    #[test]
    fn zero_is_the_smallest_working_set() {
        for size in [CacheSize::Percent(0.0), CacheSize::Bytes(0), CacheSize::Bytes(1000)] {
            assert_eq!(size.slots(&BUDGET).unwrap(), (8, true), "{size:?}");
        }
        // Fewer experts in the model than K: all of them.
        let tiny = SlotBudget {
            experts: 4,
            expert_bytes: 4 << 20,
            ..BUDGET
        };
        assert_eq!(CacheSize::Percent(0.0).slots(&tiny).unwrap(), (4, true));
    }

    #[test]
    fn sizes_become_slots() {
        assert_eq!(CacheSize::Percent(100.0).slots(&BUDGET).unwrap(), (10240, false));
        assert_eq!(CacheSize::Percent(25.0).slots(&BUDGET).unwrap(), (2560, false));
        assert_eq!(CacheSize::Bytes(9 << 20).slots(&BUDGET).unwrap(), (9, false));
        assert_eq!(CacheSize::Auto.slots(&BUDGET).unwrap(), (10240, false));
        let small = SlotBudget {
            room: 100 << 20,
            ..BUDGET
        };
        assert_eq!(CacheSize::Auto.slots(&small).unwrap(), (100, false));
        let e = CacheSize::Percent(50.0).slots(&small).unwrap_err().to_string();
        assert!(e.contains("does not fit"), "{e}");
        let none = SlotBudget { room: 0, ..BUDGET };
        let e = CacheSize::Percent(0.0).slots(&none).unwrap_err().to_string();
        assert!(e.contains("smallest working set"), "{e}");
    }
}
