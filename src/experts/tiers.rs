//! Where each MoE layer's experts live when they do not all fit in the
//! memory the host may lock (plain Rust, for any backend that copies
//! experts to a device):
//!
//! - **pinned** layers: their files mapped and locked in host memory
//!   (registered with the driver), so that a miss is one DMA from there;
//! - **held** layers: not pinned, so every miss would be read from the
//!   page cache or the disk into a staging buffer first (several times the
//!   cost of a DMA); their experts are copied to the device cache once at
//!   start and stay there;
//! - the rest (**staged**): misses read into staging buffers, through the
//!   device cache's usual policy.
//!
//! Layers are pinned in order while the budget lasts (all layers of a
//! model are about the same size). Held layers take device slots that the
//! cache then no longer moves, so at least a quarter of the slots (and two
//! layers' experts) stay free for the rest.

/// The layers of each tier, in model order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayerTiers {
    pub pinned: Vec<usize>,
    pub held: Vec<usize>,
    pub staged: Vec<usize>,
}

impl LayerTiers {
    /// Bytes of the pinned layers, given each layer's bytes.
    pub fn pinned_bytes(&self, bytes_of: impl Fn(usize) -> u64) -> u64 {
        self.pinned.iter().map(|&l| bytes_of(l)).sum()
    }
}

/// The tiers of `layers` (each `(layer, bytes of its file)`, in model
/// order) for a host that may lock `pin_budget` bytes and a device cache
/// of `n_slots` slots of one expert each, layers of `n_experts` experts.
/// With every layer pinned nothing is held (each miss is a DMA already).
pub fn plan(layers: &[(usize, u64)], pin_budget: u64, n_slots: usize, n_experts: usize) -> LayerTiers {
    let mut tiers = LayerTiers::default();
    let mut used = 0u64;
    let mut rest = Vec::new();
    for &(l, bytes) in layers {
        // In order while the budget lasts: a later, smaller layer does not
        // skip ahead of a larger one left out.
        if rest.is_empty() && used.saturating_add(bytes) <= pin_budget {
            used += bytes;
            tiers.pinned.push(l);
        } else {
            rest.push(l);
        }
    }
    let keep_free = (n_slots / 4).max(2 * n_experts);
    let can_hold = match n_experts {
        0 => 0,
        e => n_slots.saturating_sub(keep_free) / e,
    };
    let held = can_hold.min(rest.len());
    tiers.held = rest[..held].to_vec();
    tiers.staged = rest[held..].to_vec();
    tiers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers(n: usize, bytes: u64) -> Vec<(usize, u64)> {
        (0..n).map(|l| (l, bytes)).collect()
    }

    #[test]
    fn everything_pinned_holds_nothing() {
        let t = plan(&layers(40, 100), 4000, 2560, 256);
        assert_eq!(t.pinned, (0..40).collect::<Vec<_>>());
        assert!(t.held.is_empty() && t.staged.is_empty());
        assert_eq!(t.pinned_bytes(|_| 100), 4000);
    }

    #[test]
    fn the_unpinned_are_held_while_a_quarter_of_the_slots_stays_free() {
        // 16 of 40 layers pinned; 2560 slots keep 640 free: 7 layers held.
        let t = plan(&layers(40, 453), 16 * 453 + 100, 2560, 256);
        assert_eq!(t.pinned, (0..16).collect::<Vec<_>>());
        assert_eq!(t.held, (16..23).collect::<Vec<_>>());
        assert_eq!(t.staged, (23..40).collect::<Vec<_>>());
        let free = 2560 - 256 * t.held.len();
        assert!(free >= 2560 / 4, "{free} slots left to the rest");
    }

    #[test]
    fn a_small_cache_holds_none_and_no_budget_pins_none() {
        let t = plan(&layers(8, 10), 0, 600, 256);
        assert!(t.pinned.is_empty() && t.held.is_empty());
        assert_eq!(t.staged.len(), 8);
        // Two layers' experts must stay free: 700 slots hold none.
        assert!(plan(&layers(8, 10), 0, 700, 256).held.is_empty());
        assert_eq!(plan(&layers(8, 10), 0, 800, 256).held, vec![0]);
        assert!(plan(&layers(3, 10), 0, 100, 0).held.is_empty());
    }

    #[test]
    fn pinning_stops_at_the_first_layer_over_budget() {
        let l = [(1, 50), (3, 80), (5, 10)];
        let t = plan(&l, 100, 0, 4);
        assert_eq!(t.pinned, vec![1]);
        assert_eq!(t.staged, vec![3, 5]);
    }

    #[test]
    fn more_slots_than_unpinned_experts_hold_them_all() {
        let t = plan(&layers(10, 10), 50, 100_000, 64);
        assert_eq!(t.pinned.len(), 5);
        assert_eq!(t.held, vec![5, 6, 7, 8, 9]);
        assert!(t.staged.is_empty());
    }
}
