//! Saving and loading a sequence's state in the MFLX wire format
//! (SPEC.md §4): a header of u32 fields, then one record per layer, then
//! (version 3 on) a CRC-32 of everything before it. Version 4 adds the
//! caches' element types; older snapshots hold f32 caches. A snapshot of
//! one cache type loads into a model opened with another (its values are
//! rounded to the new type).

use super::{LayerState, Net, State};
use crate::backend::{Backend, KvType, KvTypes, Strided};
use crate::checksum::{crc32, split_trailer};
use crate::config::AttnKind;
use crate::error::{Error, Result};

pub const MAGIC: u32 = 0x4D46_4C58;
/// The version written; 1 and 2 (no checksum) and 3 (f32 caches) are
/// still read.
pub const VERSION: u32 = 4;

/// The header fields of a snapshot, in wire order after magic and version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    num_layers: u32,
    full_attn_interval: u32,
    num_kv_heads: u32,
    head_dim: u32,
    linear_conv_bytes: u32,
    linear_ssm_bytes: u32,
    kv_lora_rank: u32,
    qk_rope_head_dim: u32,
}

const FIELD_NAMES: [&str; 8] = [
    "num_layers",
    "full_attn_interval",
    "num_kv_heads",
    "head_dim",
    "linear_conv_bytes",
    "linear_ssm_bytes",
    "kv_lora_rank",
    "qk_rope_head_dim",
];

impl Header {
    fn fields(&self) -> [u32; 8] {
        [
            self.num_layers,
            self.full_attn_interval,
            self.num_kv_heads,
            self.head_dim,
            self.linear_conv_bytes,
            self.linear_ssm_bytes,
            self.kv_lora_rank,
            self.qk_rope_head_dim,
        ]
    }
}

/// Reads little-endian values from a snapshot, with errors that say where.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8]> {
        if self.buf.len() - self.at < n {
            return Err(snap_err(format!(
                "truncated: {what} needs {n} bytes at offset {}, {} remain",
                self.at,
                self.buf.len() - self.at
            )));
        }
        let s = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn f32s(&mut self, n: usize, what: &str) -> Result<Vec<f32>> {
        self.rows(KvType::F32, n, 1, what)
    }
    /// `rows` rows of `width` values of type `t`, decoded.
    fn rows(&mut self, t: KvType, rows: usize, width: usize, what: &str) -> Result<Vec<f32>> {
        let bytes = rows
            .checked_mul(t.row_bytes(width))
            .ok_or_else(|| snap_err(format!("{what}: length overflows")))?;
        let mut out = vec![0.0f32; rows * width];
        t.decode(self.take(bytes, what)?, width, &mut out);
        Ok(out)
    }
}

fn snap_err(msg: String) -> Error {
    Error::format("state snapshot", msg)
}

/// A layer's data decoded from a snapshot, before it touches any state.
enum Record {
    Cache { a: Vec<f32>, b: Vec<f32> },
    Delta { conv: Vec<f32>, ssm: Vec<f32> },
}

impl<B: Backend> Net<B> {
    fn header(&self) -> Header {
        let c = &self.cfg;
        let kinds: Vec<AttnKind> = c.layers.iter().map(|l| l.attn).collect();
        let full_attn_interval = if kinds.iter().all(|k| *k != AttnKind::Linear) {
            1
        } else {
            // The period of the full-attention layers where they are regular;
            // 0 for an irregular mix (`layer_types`).
            (2..=kinds.len())
                .find(|&k| {
                    kinds
                        .iter()
                        .enumerate()
                        .all(|(i, a)| (*a == AttnKind::Full) == ((i + 1) % k == 0))
                })
                .unwrap_or(0) as u32
        };
        let (conv, ssm) = match &c.linear {
            Some(l) => (
                ((l.conv_kernel - 1) * l.conv_dim() * 4) as u32,
                (l.num_value_heads * l.value_head_dim * l.key_head_dim * 4) as u32,
            ),
            None => (0, 0),
        };
        let (kvr, dr) = c
            .mla
            .as_ref()
            .map_or((0, 0), |m| (m.kv_lora_rank as u32, m.qk_rope_head_dim as u32));
        let mla = c.mla.is_some();
        Header {
            num_layers: c.num_hidden_layers as u32,
            full_attn_interval,
            num_kv_heads: if mla { 0 } else { c.num_key_value_heads as u32 },
            head_dim: if mla { 0 } else { c.head_dim as u32 },
            linear_conv_bytes: conv,
            linear_ssm_bytes: ssm,
            kv_lora_rank: kvr,
            qk_rope_head_dim: dr,
        }
    }

    /// Bytes of a snapshot holding `len` positions.
    pub fn state_size(&self, len: usize) -> usize {
        let h = self.header();
        let kv = self.kv_types();
        // Header (magic, version, 8 fields, 2 types) and checksum trailer.
        let mut n = 48 + 4;
        for l in &self.cfg.layers {
            n += match l.attn {
                AttnKind::Full => {
                    let row = (h.num_kv_heads * h.head_dim) as usize;
                    4 + len * (kv.k.row_bytes(row) + kv.v.row_bytes(row))
                }
                AttnKind::Mla => {
                    4 + len * (kv.k.row_bytes(h.kv_lora_rank as usize) + kv.k.row_bytes(h.qk_rope_head_dim as usize))
                }
                AttnKind::Linear => (h.linear_conv_bytes + h.linear_ssm_bytes) as usize,
            };
        }
        n
    }

    /// Rows `0..len` of a cache, decoded.
    fn download_rows(&self, c: &B::Cache, len: usize, width: usize) -> Result<Vec<f32>> {
        let mut v = vec![0.0f32; len * width];
        self.b.cache_download(c, 0, &mut v)?;
        Ok(v)
    }

    fn download_vec(&self, buf: &B::Buf, n: usize) -> Result<Vec<f32>> {
        let mut v = vec![0.0f32; n];
        self.b.download(buf, 0, &mut v)?;
        Ok(v)
    }

    /// Copies, on the device, of the recurrent layers' state (conv, ssm),
    /// in layer order: with the attention caches below a position left as
    /// they are, all a checkpoint at that position needs.
    pub fn save_recurrent(&self, st: &State<B>) -> Result<Vec<(B::Buf, B::Buf)>> {
        let h = self.header();
        let (nc, ns) = (h.linear_conv_bytes as usize / 4, h.linear_ssm_bytes as usize / 4);
        let mut out = Vec::new();
        for ls in &st.layers {
            if let LayerState::Delta { conv, ssm } = ls {
                let (mut c, mut s) = (self.b.alloc(nc)?, self.b.alloc(ns)?);
                self.b.copy(conv, &mut c, Strided::contiguous(nc, 0, 0))?;
                self.b.copy(ssm, &mut s, Strided::contiguous(ns, 0, 0))?;
                out.push((c, s));
            }
        }
        Ok(out)
    }

    /// Put back what [`Net::save_recurrent`] copied.
    pub fn load_recurrent(&self, st: &mut State<B>, saved: &[(B::Buf, B::Buf)]) -> Result<()> {
        let h = self.header();
        let (nc, ns) = (h.linear_conv_bytes as usize / 4, h.linear_ssm_bytes as usize / 4);
        let mut it = saved.iter();
        for ls in &mut st.layers {
            if let LayerState::Delta { conv, ssm } = ls {
                let (c, s) = it
                    .next()
                    .ok_or_else(|| Error::Invalid("a checkpoint with fewer recurrent layers than the model".into()))?;
                self.b.copy(c, conv, Strided::contiguous(nc, 0, 0))?;
                self.b.copy(s, ssm, Strided::contiguous(ns, 0, 0))?;
            }
        }
        Ok(())
    }

    /// Append the snapshot of `st` (holding `len` positions) to `out`.
    pub fn save_state(&self, st: &State<B>, len: usize, out: &mut Vec<u8>) -> Result<()> {
        let h = self.header();
        let kv = self.kv_types();
        out.reserve(self.state_size(len));
        let start = out.len();
        for w in [MAGIC, VERSION]
            .into_iter()
            .chain(h.fields())
            .chain([kv.k.code(), kv.v.code()])
        {
            out.extend_from_slice(&w.to_le_bytes());
        }
        let put = |out: &mut Vec<u8>, v: &[f32]| v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        for ls in &st.layers {
            let Some((ra, rb)) = self.row_sizes(ls) else {
                if let LayerState::Delta { conv, ssm } = ls {
                    put(out, &self.download_vec(conv, h.linear_conv_bytes as usize / 4)?);
                    put(out, &self.download_vec(ssm, h.linear_ssm_bytes as usize / 4)?);
                }
                continue;
            };
            let (a, b, tb) = match ls {
                LayerState::Kv { k, v } => (k, v, kv.v),
                LayerState::Mla { latent, kpe } => (latent, kpe, kv.k),
                LayerState::Delta { .. } => continue,
            };
            out.extend_from_slice(&(len as i32).to_le_bytes());
            for (c, w, t) in [(a, ra, kv.k), (b, rb, tb)] {
                let at = out.len();
                out.resize(at + len * t.row_bytes(w), 0);
                t.encode(&self.download_rows(c, len, w)?, w, &mut out[at..]);
            }
        }
        let crc = crc32(&out[start..]);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok(())
    }

    /// Decode and check a whole snapshot; returns the state and its length.
    /// Nothing outside the returned value is touched, so a bad buffer
    /// leaves the caller's state as it was.
    pub fn load_state(&self, buf: &[u8], max_len: usize) -> Result<(State<B>, usize)> {
        let mut r = Reader { buf, at: 0 };
        if r.u32("magic")? != MAGIC {
            return Err(snap_err("not an MFLX state snapshot (bad magic)".into()));
        }
        let version = r.u32("version")?;
        if version >= 3 {
            let (body, stored) =
                split_trailer(buf).ok_or_else(|| snap_err("truncated: no room for the checksum".into()))?;
            let actual = crc32(body);
            if actual != stored {
                return Err(snap_err(format!(
                    "checksum mismatch (stored {stored:08x}, computed {actual:08x}): the snapshot is corrupt"
                )));
            }
            r.buf = body;
        }
        let buf = r.buf;
        let want = self.header();
        let got: Vec<u32> = match version {
            2..=4 => (0..8).map(|i| r.u32(FIELD_NAMES[i])).collect::<Result<_>>()?,
            1 => {
                if self.cfg.mla.is_some() {
                    return Err(snap_err(
                        "version 1 snapshots cannot hold MLA state; this model needs version 2 or later".into(),
                    ));
                }
                let mut v: Vec<u32> = (0..6).map(|i| r.u32(FIELD_NAMES[i])).collect::<Result<_>>()?;
                v.extend([0, 0]);
                v
            }
            v => return Err(snap_err(format!("unsupported version {v} (this build reads 1 to 4)"))),
        };
        // The snapshot's cache types (f32 before version 4).
        let saved = match version {
            4 => {
                let mut t = |what: &str| {
                    let c = r.u32(what)?;
                    KvType::from_code(c).ok_or_else(|| snap_err(format!("{what}: unknown KV cache type code {c}")))
                };
                KvTypes {
                    k: t("K cache type")?,
                    v: t("V cache type")?,
                }
            }
            _ => KvTypes::both(KvType::F32),
        };
        for ((name, w), g) in FIELD_NAMES.iter().zip(want.fields()).zip(&got) {
            if w != *g {
                return Err(snap_err(format!("header field {name} is {g}, the open model has {w}")));
            }
        }
        let mut records = Vec::with_capacity(self.cfg.layers.len());
        let mut seq_len: Option<usize> = None;
        for (i, l) in self.cfg.layers.iter().enumerate() {
            let (ra, rb, tb) = match l.attn {
                AttnKind::Full => {
                    let row = (want.num_kv_heads * want.head_dim) as usize;
                    (row, row, saved.v)
                }
                AttnKind::Mla => (want.kv_lora_rank as usize, want.qk_rope_head_dim as usize, saved.k),
                AttnKind::Linear => {
                    let conv = r.f32s(want.linear_conv_bytes as usize / 4, &format!("layer {i} conv state"))?;
                    let ssm = r.f32s(
                        want.linear_ssm_bytes as usize / 4,
                        &format!("layer {i} recurrent state"),
                    )?;
                    records.push(Record::Delta { conv, ssm });
                    continue;
                }
            };
            let len = r.u32(&format!("layer {i} length"))? as i32;
            if len < 0 || len as usize > max_len {
                return Err(snap_err(format!("layer {i}: length {len} outside 0..={max_len}")));
            }
            let len = len as usize;
            if *seq_len.get_or_insert(len) != len {
                return Err(snap_err(format!(
                    "layer {i}: length {len} differs from earlier layers ({seq_len:?})"
                )));
            }
            let a = r.rows(saved.k, len, ra, &format!("layer {i} cache"))?;
            let b = r.rows(tb, len, rb, &format!("layer {i} cache"))?;
            records.push(Record::Cache { a, b });
        }
        if r.at != buf.len() {
            return Err(snap_err(format!(
                "{} trailing bytes after the last layer",
                buf.len() - r.at
            )));
        }
        let len = seq_len.unwrap_or(0);
        let mut st = self.new_state(max_len)?;
        for (ls, rec) in st.layers.iter_mut().zip(records) {
            match (ls, rec) {
                (
                    LayerState::Kv { k: a, v: b } | LayerState::Mla { latent: a, kpe: b },
                    Record::Cache { a: da, b: db },
                ) => {
                    if let (Some(wa), Some(wb)) = (da.len().checked_div(len), db.len().checked_div(len)) {
                        self.b.cache_upload(a, 0, wa, &da)?;
                        self.b.cache_upload(b, 0, wb, &db)?;
                    }
                }
                (LayerState::Delta { conv, ssm }, Record::Delta { conv: dc, ssm: ds }) => {
                    *conv = self.b.upload(&dc)?;
                    *ssm = self.b.upload(&ds)?;
                }
                _ => return Err(snap_err("layer kinds do not match the model".into())),
            }
        }
        Ok((st, len))
    }
}
