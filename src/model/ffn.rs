//! Feed-forward parts: the dense SwiGLU MLP, and the MoE block (router
//! logits, then routing and the routed experts in the backend's `moe`;
//! shared experts).

use super::timing::Phase;
use super::{load_mat, Ctx};
use crate::backend::{Backend, MoeArgs, MoeHint, MoeInputs};
use crate::config::ModelConfig;
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
        let [mut g, mut u] = self.gate_up_bufs(b, n)?;
        b.linear_many(&[&self.gate, &self.up], x, n, &mut [&mut g, &mut u])?;
        self.swiglu_down(b, &g, &u, n, out)
    }

    /// Zeroed buffers for the gate and up products of `n` tokens.
    fn gate_up_bufs(&self, b: &B, n: usize) -> Result<[B::Buf; 2]> {
        Ok([b.alloc(n * self.inter)?, b.alloc(n * self.inter)?]) // [n, inter] each
    }

    /// out `[n, hidden]` = down(silu(g) ⊙ u) from the gate and up products.
    fn swiglu_down(&self, b: &B, g: &B::Buf, u: &B::Buf, n: usize, out: &mut B::Buf) -> Result<()> {
        b.swiglu_linear(&self.down, g, u, n, self.inter, out)
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
        let bias = if cfg.moe.router_bias {
            Some(b.upload(&wf.vector(&format!("{p}.mlp.gate.e_score_correction_bias"), cfg.num_experts)?)?)
        } else {
            None
        };
        let si = cfg.shared_expert_intermediate_size;
        let shared_name = cfg.moe.shared_name;
        let shared = if si > 0 {
            Some(Mlp::load(b, wf, &format!("{p}.mlp.{shared_name}"), hid, si)?)
        } else {
            None
        };
        let shared_gate = if si > 0 && cfg.moe.shared_gated {
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

    /// Route the router logits `[n, n_experts]` on the host, as the CPU
    /// backend does, and add the experts chosen to the routing trace.
    fn trace(&self, c: &Ctx<B>, logits: &B::Buf) -> Result<()> {
        let (b, cfg, n) = (c.b, c.cfg, c.n);
        let e = cfg.num_experts;
        let mut host = vec![0.0f32; n * e];
        b.download(logits, 0, &mut host)?;
        let bias = match &self.bias {
            Some(buf) => {
                let mut v = vec![0.0f32; e];
                b.download(buf, 0, &mut v)?;
                Some(v)
            }
            None => None,
        };
        let k = cfg.num_experts_per_tok;
        let routes = super::router::route(&cfg.routing, &host, n, k, bias.as_deref());
        for s in c.segs {
            c.trace
                .push(self.layer, s.pos0, &routes.ids[s.off * k..(s.off + s.n) * k], k);
        }
        Ok(())
    }

    /// x `[n, hidden]` (normed) → out `[n, hidden]` (overwritten).
    /// `next`: the next MoE layer; where the backend wants it for a pass of
    /// `n` tokens (it streams experts), its router also runs on x, as a
    /// guess at its experts.
    pub fn forward(&self, c: &Ctx<B>, x: &B::Buf, next: Option<&MoeBlock<B>>, out: &mut B::Buf) -> Result<()> {
        let (b, cfg, n) = (c.b, c.cfg, c.n);
        let (hid, e) = (cfg.hidden_size, cfg.num_experts);
        let mut logits = b.alloc(n * e)?; // [n, n_experts]
        let next = next.filter(|_| b.wants_moe_hint(c.store, n));
        let mut hint_logits = match next {
            Some(_) => Some(b.alloc(n * e)?), // [n, n_experts] of the next layer
            None => None,
        };
        let mut gate_up = match &self.shared {
            Some(mlp) => Some(mlp.gate_up_bufs(b, n)?),
            None => None,
        };
        let mut gate_logit = match &self.shared_gate {
            Some(_) => Some(b.alloc(n)?), // [n, 1]
            None => None,
        };
        // Every product that reads x in one call: the router, the shared
        // expert's gate and up, and its gate logit.
        c.timer.measure(b, Phase::Routing, || {
            let mut ws = vec![&self.router];
            let mut ys = vec![&mut logits];
            if let (Some(mlp), Some([g, u])) = (&self.shared, gate_up.as_mut()) {
                ws.extend([&mlp.gate, &mlp.up]);
                ys.extend([g, u]);
            }
            if let (Some(w), Some(l)) = (&self.shared_gate, gate_logit.as_mut()) {
                ws.push(w);
                ys.push(l);
            }
            if let (Some(nm), Some(l)) = (next, hint_logits.as_mut()) {
                ws.push(&nm.router);
                ys.push(l);
            }
            b.linear_many(&ws, x, n, &mut ys)
        })?;
        if c.trace.enabled() {
            self.trace(c, &logits)?;
        }
        c.timer.measure(b, Phase::DenseFfn, || {
            match (&self.shared, &gate_up) {
                (Some(mlp), Some([g, u])) => mlp.swiglu_down(b, g, u, n, out)?,
                _ => *out = b.alloc(n * hid)?,
            }
            if let Some(gl) = &gate_logit {
                // out = sigmoid(g·x) ⊙ shared(x), then the routed experts are added.
                let shared = std::mem::replace(out, b.alloc(n * hid)?);
                b.add_scaled_rows(out, &shared, gl, n, hid, true)?;
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
            decode: c.segs.iter().all(|s| s.n == 1),
        };
        // Routing happens inside `moe` (on the device where there is one).
        let m = MoeInputs {
            x,
            logits: &logits,
            bias: self.bias.as_ref(),
            store: c.store,
            hint: next.zip(hint_logits.as_ref()).map(|(nm, l)| MoeHint {
                layer: nm.layer,
                logits: l,
            }),
        };
        c.timer.measure(b, Phase::Experts, || b.moe(m, args, out))
    }
}
