//! The memory plan of a device: what is free after the dense weights goes
//! to the KV caches of the context and sequences asked for, then the
//! activations of the largest prefill chunk, then a margin, and the rest to
//! the expert cache. The context is settled here, before anything is
//! allocated, so that one that cannot fit is refused at open with the
//! numbers, not as an out-of-memory error in the middle of an answer.

use crate::error::{Error, Result};

/// What a plan is made from (bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanInput {
    /// Free device memory once the dense weights are loaded.
    pub free: u64,
    /// Kept free for the driver and allocations outside the plan.
    pub margin: u64,
    /// The activations of the largest prefill chunk.
    pub activations: u64,
    /// KV cache bytes of one position (every layer, K and V).
    pub kv_per_token: u64,
    /// Sequences that each hold a context (`serve --parallel`).
    pub sequences: usize,
    /// The model's longest context (`max_position_embeddings`).
    pub model_ctx: usize,
    /// The context asked for (`-c`); `None`: the model's, capped so that
    /// the caches take at most half of the room.
    pub asked: Option<usize>,
    /// The smallest expert cache that works (one layer's active experts).
    pub min_experts: u64,
}

/// A settled plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryPlan {
    /// Positions each sequence holds.
    pub ctx: usize,
    pub sequences: usize,
    /// The KV caches of every sequence at `ctx`.
    pub kv_bytes: u64,
    pub kv_per_token: u64,
    pub activations: u64,
    pub margin: u64,
    /// What is left for the expert cache.
    pub expert_room: u64,
    /// The model's context was cut to fit (no `-c` given).
    pub capped: bool,
}

const GB: f64 = 1e9;

impl PlanInput {
    /// Settle the context and what is left for the experts.
    pub fn plan(&self) -> Result<MemoryPlan> {
        let seqs = self.sequences.max(1) as u64;
        let per_ctx = self.kv_per_token.saturating_mul(seqs); // bytes a position of every sequence
        let room = self.free.saturating_sub(self.margin + self.activations);
        let (ctx, capped) = match self.asked {
            Some(0) => return Err(Error::Invalid("the context (-c) must be at least 1 token".into())),
            Some(c) if c > self.model_ctx => {
                return Err(Error::Invalid(format!(
                    "a context of {c} tokens is more than the model's {} (max_position_embeddings)",
                    self.model_ctx
                )))
            }
            Some(c) => (c, false),
            None => {
                let fit = (room / 2).checked_div(per_ctx).unwrap_or(u64::MAX);
                let fit = fit.min(self.model_ctx as u64) as usize;
                // A round number of tokens where the model's is cut.
                let ctx = if fit < self.model_ctx { fit / 256 * 256 } else { fit };
                (ctx.max(1), fit < self.model_ctx)
            }
        };
        let kv_bytes = per_ctx.saturating_mul(ctx as u64);
        if kv_bytes.saturating_add(self.min_experts) > room {
            let most = room.saturating_sub(self.min_experts).checked_div(per_ctx).unwrap_or(0);
            return Err(Error::Invalid(format!(
                "a context of {ctx} tokens × {seqs} sequence{} needs {:.2} GB of KV cache ({} bytes a token), \
                 and the smallest expert cache {:.2} GB more: {:.2} GB of device memory is left after the dense \
                 weights, activations ({:.2} GB) and margin ({:.2} GB). At most {most} tokens fit; use a smaller \
                 -c, fewer --parallel sequences or a smaller --cache-type-k/-v (q8_0)",
                if seqs == 1 { "" } else { "s" },
                kv_bytes as f64 / GB,
                self.kv_per_token,
                self.min_experts as f64 / GB,
                room as f64 / GB,
                self.activations as f64 / GB,
                self.margin as f64 / GB,
            )));
        }
        Ok(MemoryPlan {
            ctx,
            sequences: seqs as usize,
            kv_bytes,
            kv_per_token: self.kv_per_token,
            activations: self.activations,
            margin: self.margin,
            expert_room: room - kv_bytes,
            capped,
        })
    }
}

impl MemoryPlan {
    /// One line for the start of a run.
    pub fn describe(&self) -> String {
        let gb = |b: u64| b as f64 / GB;
        format!(
            "memory plan: KV cache {:.2} GB ({} tokens × {} sequence{}, {} bytes a token{}), activations {:.2} GB, \
             margin {:.2} GB, {:.2} GB left for experts",
            gb(self.kv_bytes),
            self.ctx,
            self.sequences,
            if self.sequences == 1 { "" } else { "s" },
            self.kv_per_token,
            if self.capped {
                "; the model's context cut to fit, -c to choose"
            } else {
                ""
            },
            gb(self.activations),
            gb(self.margin),
            gb(self.expert_room)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn input() -> PlanInput {
        PlanInput {
            free: 40 * GIB,
            margin: GIB,
            activations: GIB,
            kv_per_token: 96 << 10,
            sequences: 1,
            model_ctx: 262_144,
            asked: None,
            min_experts: GIB / 2,
        }
    }

    #[test]
    fn the_default_context_takes_at_most_half_of_the_room() {
        let p = input().plan().unwrap();
        assert!(p.capped);
        assert!(
            p.kv_bytes <= 19 * GIB && p.kv_bytes > 19 * GIB - ((256 * 96) << 10),
            "{p:?}"
        );
        assert_eq!(p.ctx % 256, 0);
        assert_eq!(p.expert_room, 38 * GIB - p.kv_bytes);
        // A model whose whole context fits keeps it.
        let small = PlanInput {
            model_ctx: 40_960,
            ..input()
        };
        let p = small.plan().unwrap();
        assert_eq!((p.ctx, p.capped), (40_960, false));
    }

    #[test]
    fn sequences_share_the_caches() {
        let one = input().plan().unwrap();
        let four = PlanInput {
            sequences: 4,
            ..input()
        }
        .plan()
        .unwrap();
        assert!(one.capped && four.capped, "{one:?} {four:?}");
        assert!(
            four.ctx * 4 <= one.ctx + 256 * 4 && four.ctx * 4 + 256 * 4 >= one.ctx,
            "{one:?} {four:?}"
        );
        assert_eq!(four.kv_bytes, four.ctx as u64 * 4 * (96 << 10));
    }

    #[test]
    fn a_context_that_cannot_fit_is_refused_with_the_numbers() {
        let asked = PlanInput {
            asked: Some(262_144),
            free: 20 * GIB,
            ..input()
        };
        let e = asked.plan().unwrap_err().to_string();
        assert!(
            e.contains("262144 tokens") && e.contains("At most") && e.contains("q8_0"),
            "{e}"
        );
        let too_long = PlanInput {
            asked: Some(300_000),
            ..input()
        };
        assert!(too_long
            .plan()
            .unwrap_err()
            .to_string()
            .contains("max_position_embeddings"));
        let fits = PlanInput {
            asked: Some(32_768),
            ..input()
        };
        let p = fits.plan().unwrap();
        assert_eq!((p.ctx, p.capped, p.kv_bytes), (32_768, false, 32_768 * (96 << 10)));
    }
}
