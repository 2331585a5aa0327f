//! Feed-forward parts: the dense SwiGLU MLP, and the MoE block (router
//! logits, then routing and the routed experts in the backend's `moe`;
//! shared experts).

use super::timing::Phase;
use super::{load_mat, Ctx};
use crate::backend::{Backend, MoeArgs};
use crate::config::{Arch, ModelConfig};
use crate::error::Result;
use crate::format::packed::WeightsFile;

pub struct Mlp<B: Backend> {
    gate: B::Matrix, // [inter, hidden]
    up: B::Matrix,   // [inter, hidden]
    down: B::Matrix, // [hidden, inter]
    inter: usize,
}

impl<B: Backend> Mlp<B> {
    pub fn load(b: &B, wf: &WeightsFile, p: &str, hidden: usize, inter: usize) -> Result<Self> {
        Ok(Mlp {
            gate: load_mat(b, wf, &format!("{p}.gate_proj"), inter, hidden)?,
            up: load_mat(b, wf, &format!("{p}.up_proj"), inter, hidden)?,
            down: load_mat(b, wf, &format!("{p}.down_proj"), hidden, inter)?,
            inter,
        })
    }

    /// x `[n, hidden]` → out `[n, hidden]`.
    pub fn forward(&self, b: &B, x: &B::Buf, n: usize, out: &mut B::Buf) -> Result<()> {
        let mut g = b.alloc(n * self.inter)?;
        let mut u = b.alloc(n * self.inter)?;
        b.linear(&self.gate, x, n, &mut g)?;
        b.linear(&self.up, x, n, &mut u)?;
        let mut hbuf = b.alloc(n * self.inter)?;
        b.swiglu(&g, &u, n * self.inter, &mut hbuf)?;
        b.linear(&self.down, &hbuf, n, out)
    }
}

pub struct MoeBlock<B: Backend> {
    router: B::Matrix, // [n_experts, hidden]
    /// DeepSeek `e_score_correction_bias` `[n_experts]`.
    bias: Option<B::Buf>,
    shared: Option<Mlp<B>>,
    /// Qwen: `[1, hidden]`, the shared expert is scaled by sigmoid(gate·x).
    shared_gate: Option<B::Matrix>,
    layer: usize,
}

impl<B: Backend> MoeBlock<B> {
    pub fn load(b: &B, wf: &WeightsFile, p: &str, layer: usize, cfg: &ModelConfig) -> Result<Self> {
        let hid = cfg.hidden_size;
        let bias = if cfg.arch == Arch::DeepseekV3 {
            Some(b.upload(&wf.vector(&format!("{p}.mlp.gate.e_score_correction_bias"), cfg.num_experts)?)?)
        } else {
            None
        };
        let si = cfg.shared_expert_intermediate_size;
        let shared_name = if cfg.arch == Arch::DeepseekV3 {
            "shared_experts"
        } else {
            "shared_expert"
        };
        let shared = if si > 0 {
            Some(Mlp::load(b, wf, &format!("{p}.mlp.{shared_name}"), hid, si)?)
        } else {
            None
        };
        let shared_gate = if si > 0 && cfg.shared_expert_gated {
            Some(load_mat(b, wf, &format!("{p}.mlp.shared_expert_gate"), 1, hid)?)
        } else {
            None
        };
        Ok(MoeBlock {
            router: load_mat(b, wf, &format!("{p}.mlp.gate"), cfg.num_experts, hid)?,
            bias,
            shared,
            shared_gate,
            layer,
        })
    }

    /// x `[n, hidden]` (normed) → out `[n, hidden]` (overwritten).
    pub fn forward(&self, c: &Ctx<B>, x: &B::Buf, out: &mut B::Buf) -> Result<()> {
        let (b, cfg, n) = (c.b, c.cfg, c.n);
        let (hid, e) = (cfg.hidden_size, cfg.num_experts);
        let logits = c.timer.measure(b, Phase::Routing, || {
            let mut logits = b.alloc(n * e)?; // [n, n_experts]
            b.linear(&self.router, x, n, &mut logits)?;
            Ok(logits)
        })?;
        c.timer.measure(b, Phase::DenseFfn, || {
            match &self.shared {
                Some(mlp) => mlp.forward(b, x, n, out)?,
                None => *out = b.alloc(n * hid)?,
            }
            if let Some(g) = &self.shared_gate {
                // out = sigmoid(g·x) ⊙ shared(x), then the routed experts are added.
                let mut gl = b.alloc(n)?;
                b.linear(g, x, n, &mut gl)?;
                let shared = std::mem::replace(out, b.alloc(n * hid)?);
                b.add_scaled_rows(out, &shared, &gl, n, hid, true)?;
            }
            Ok(())
        })?;
        let args = MoeArgs {
            layer: self.layer,
            n,
            hidden: hid,
            inter: cfg.moe_intermediate_size,
            n_experts: e,
            k: cfg.num_experts_per_tok,
            routing: &cfg.routing,
        };
        // Routing happens inside `moe` (on the device where there is one).
        c.timer.measure(b, Phase::Experts, || {
            b.moe(x, &logits, self.bias.as_ref(), c.store, args, out)
        })
    }
}
