//! The packed model directory (SPEC.md §2): `model_weights.bin` + its
//! manifest `model_weights.json`, and `packed_experts/` with one file per
//! MoE layer described by `layout.json`.

use crate::config::{FfnKind, ModelConfig};
use crate::error::{Error, Result};
use crate::format::{Dtype, MatrixData, MatrixView, Region};
use memmap2::Mmap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const WEIGHTS_FILE: &str = "model_weights.bin";
pub const MANIFEST_FILE: &str = "model_weights.json";
pub const EXPERTS_DIR: &str = "packed_experts";
pub const LAYOUT_FILE: &str = "layout.json";
/// Every tensor in `model_weights.bin` starts at a multiple of this.
pub const ALIGN: u64 = 64;

/// One tensor of `model_weights.bin`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TensorEntry {
    pub offset: u64,
    pub size: u64,
    pub shape: Vec<usize>,
    pub dtype: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub bits: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub group_size: Option<usize>,
}

/// `model_weights.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub model: String,
    pub num_tensors: usize,
    pub tensors: BTreeMap<String, TensorEntry>,
    pub config: serde_json::Value,
}

/// One component of an expert (e.g. `gate_proj.weight`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Component {
    pub name: String,
    pub offset: usize,
    pub size: usize,
    pub dtype: String,
    pub shape: Vec<usize>,
}

/// The experts of one layer file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LayerLayout {
    pub bits: u32,
    pub expert_size: usize,
    pub components: Vec<Component>,
}

/// `packed_experts/layout.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Layout {
    pub num_layers: usize,
    pub num_experts: usize,
    pub group_size: usize,
    /// Keyed by the layer index as a decimal string.
    pub layers: BTreeMap<String, LayerLayout>,
}

/// The nine expert components, in file order.
pub const EXPERT_COMPONENTS: [&str; 9] = [
    "gate_proj.weight",
    "gate_proj.scales",
    "gate_proj.biases",
    "up_proj.weight",
    "up_proj.scales",
    "up_proj.biases",
    "down_proj.weight",
    "down_proj.scales",
    "down_proj.biases",
];

pub fn expert_file_name(layer: usize) -> String {
    format!("layer_{layer:02}.bin")
}

impl Layout {
    /// Read and check `DIR/packed_experts/layout.json`.
    pub fn read(dir: &Path) -> Result<Layout> {
        let path = dir.join(EXPERTS_DIR).join(LAYOUT_FILE);
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        Layout::parse(&bytes, &path)
    }

    /// Parse the bytes of a `layout.json` read from `path`: JSON of the
    /// right shape, layer keys that are layer indices below `num_layers`,
    /// at least one expert. Each layer's table is checked against the
    /// model by [`LayerLayout::validate`].
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Layout> {
        let layout: Layout = serde_json::from_slice(bytes).map_err(|err| Error::Json {
            path: path.to_path_buf(),
            err,
        })?;
        if layout.num_experts == 0 {
            return Err(Error::format(path, "`num_experts` is 0"));
        }
        for key in layout.layers.keys() {
            match key.parse::<usize>() {
                Ok(i) if i < layout.num_layers && i.to_string() == *key => {}
                _ => {
                    return Err(Error::format(
                        path,
                        format!(
                            "`layers` key `{key}` is not a layer index below num_layers {}",
                            layout.num_layers
                        ),
                    ))
                }
            }
        }
        Ok(layout)
    }
    /// Check the layout against the model's config: `num_layers`,
    /// `num_experts`, an entry for every MoE layer, and each entry's table
    /// ([`LayerLayout::validate`]). `path` is named in errors.
    pub fn validate_model(&self, cfg: &ModelConfig, path: &Path) -> Result<()> {
        let bad = |msg: String| Error::format(path, msg);
        if self.num_layers != cfg.num_hidden_layers {
            return Err(bad(format!(
                "`num_layers` is {}, config.json has {}",
                self.num_layers, cfg.num_hidden_layers
            )));
        }
        if self.num_experts != cfg.num_experts {
            return Err(bad(format!(
                "`num_experts` is {}, config.json has {}",
                self.num_experts, cfg.num_experts
            )));
        }
        for (i, l) in cfg.layers.iter().enumerate() {
            if l.ffn != FfnKind::Moe {
                continue;
            }
            self.layer(i)
                .ok_or_else(|| bad(format!("layer {i} is a MoE layer but `layers` has no entry for it")))?
                .validate(i, cfg.hidden_size, cfg.moe_intermediate_size, self.group_size)?;
        }
        Ok(())
    }

    pub fn layer(&self, layer: usize) -> Option<&LayerLayout> {
        self.layers.get(&layer.to_string())
    }
}

impl LayerLayout {
    /// The layout of one expert with these shapes: gate/up `[inter, hidden]`,
    /// down `[hidden, inter]`, all quantized at `bits` with bf16 scales.
    pub fn quantized(hidden: usize, inter: usize, bits: u32, group_size: usize) -> LayerLayout {
        LayerLayout::quantized_scales(hidden, inter, bits, group_size, Dtype::Bf16)
    }

    /// Like [`LayerLayout::quantized`], with scales and biases of
    /// `scale_dtype` (BF16 or F16, as an MLX source has them).
    pub fn quantized_scales(
        hidden: usize,
        inter: usize,
        bits: u32,
        group_size: usize,
        scale_dtype: Dtype,
    ) -> LayerLayout {
        let es = scale_dtype.size();
        LayerLayout::build(hidden, inter, bits, |rows, cols| {
            let groups = vec![rows, cols / group_size];
            [
                (
                    rows * cols * bits as usize / 8,
                    Dtype::U32,
                    vec![rows, cols * bits as usize / 32],
                ),
                (rows * (cols / group_size) * es, scale_dtype, groups.clone()),
                (rows * (cols / group_size) * es, scale_dtype, groups),
            ]
        })
    }

    /// Unquantized experts: each `X.weight` is `dtype` `[rows, cols]`; the
    /// `scales` / `biases` components stay in the table with size 0 and
    /// shape `[]`. `bits` is the width of `dtype`.
    pub fn float(hidden: usize, inter: usize, dtype: Dtype) -> LayerLayout {
        LayerLayout::build(hidden, inter, 8 * dtype.size() as u32, |rows, cols| {
            [
                (rows * cols * dtype.size(), dtype, vec![rows, cols]),
                (0, dtype, vec![]),
                (0, dtype, vec![]),
            ]
        })
    }

    /// The nine components in file order; `parts(rows, cols)` gives
    /// `(size, dtype, shape)` of weight, scales and biases of one matrix.
    fn build(
        hidden: usize,
        inter: usize,
        bits: u32,
        parts: impl Fn(usize, usize) -> [(usize, Dtype, Vec<usize>); 3],
    ) -> LayerLayout {
        let mut components = Vec::with_capacity(9);
        let mut offset = 0usize;
        for (proj, rows, cols) in [
            ("gate_proj", inter, hidden),
            ("up_proj", inter, hidden),
            ("down_proj", hidden, inter),
        ] {
            for (suffix, (size, dtype, shape)) in ["weight", "scales", "biases"].into_iter().zip(parts(rows, cols)) {
                components.push(Component {
                    name: format!("{proj}.{suffix}"),
                    offset,
                    size,
                    dtype: dtype.name().to_string(),
                    shape,
                });
                offset += size;
            }
        }
        LayerLayout {
            bits,
            expert_size: offset,
            components,
        }
    }

    /// Check the whole table against the expected expert shapes: the nine
    /// components in order, each directly after the previous one and
    /// inside `expert_size`, with the dtype, shape and byte size that
    /// `bits` / `group_size` give. After this, [`LayerLayout::matrices`]
    /// reads only inside an expert's bytes.
    pub fn validate(&self, layer: usize, hidden: usize, inter: usize, group_size: usize) -> Result<()> {
        let bad = |msg: String| Error::format(format!("{EXPERTS_DIR}/{LAYOUT_FILE}"), format!("layer {layer}: {msg}"));
        if self.components.len() != 9 {
            return Err(bad(format!("{} components, expected 9", self.components.len())));
        }
        let mut end = 0usize;
        for (c, want) in self.components.iter().zip(EXPERT_COMPONENTS) {
            if c.name != want {
                return Err(bad(format!("component `{}` where `{want}` was expected", c.name)));
            }
            if c.offset != end {
                return Err(bad(format!(
                    "`{want}` starts at offset {}; the previous component ends at {end}",
                    c.offset
                )));
            }
            end = match c.offset.checked_add(c.size) {
                Some(e) if e <= self.expert_size => e,
                _ => {
                    return Err(bad(format!(
                        "`{want}` (offset {}, size {}) ends past expert_size {}",
                        c.offset, c.size, self.expert_size
                    )))
                }
            };
        }
        for (k, (rows, cols)) in [(inter, hidden), (inter, hidden), (hidden, inter)]
            .into_iter()
            .enumerate()
        {
            self.validate_matrix(&self.components[3 * k..3 * k + 3], rows, cols, group_size)
                .map_err(bad)?;
        }
        Ok(())
    }

    /// One matrix's weight, scales and biases components.
    fn validate_matrix(&self, c: &[Component], rows: usize, cols: usize, group_size: usize) -> Result<(), String> {
        let (w, s, b) = (&c[0], &c[1], &c[2]);
        let dtype = |c: &Component| {
            Dtype::parse(&c.dtype, &c.name).map_err(|_| format!("`{}`: unknown dtype `{}`", c.name, c.dtype))
        };
        let check = |c: &Component, shape: &[usize], elem: usize| -> Result<(), String> {
            if c.shape != shape {
                return Err(format!("`{}`: shape {:?}, expected {shape:?}", c.name, c.shape));
            }
            let want = shape.iter().try_fold(elem, |a, &d| a.checked_mul(d));
            if want != Some(c.size) {
                return Err(format!(
                    "`{}`: size {}, its shape {shape:?} needs {want:?}",
                    c.name, c.size
                ));
            }
            Ok(())
        };
        match dtype(w)? {
            Dtype::U32 => {
                let bits = self.bits as usize;
                if !crate::format::quant::check_bits(self.bits) {
                    return Err(format!("`bits` is {}; packed weights have 2, 4 or 8", self.bits));
                }
                if group_size == 0 || !cols.is_multiple_of(group_size) || !(cols * bits).is_multiple_of(32) {
                    return Err(format!(
                        "`group_size` {group_size} does not divide the {cols} columns of `{}`",
                        w.name
                    ));
                }
                check(w, &[rows, cols * bits / 32], 4)?;
                let sd = dtype(s)?;
                if !matches!(sd, Dtype::Bf16 | Dtype::F16) || dtype(b)? != sd {
                    return Err(format!(
                        "`{}` / `{}`: dtypes {} / {}, expected BF16 or F16, the same for both",
                        s.name, b.name, s.dtype, b.dtype
                    ));
                }
                check(s, &[rows, cols / group_size], sd.size())?;
                check(b, &[rows, cols / group_size], sd.size())
            }
            d => {
                check(w, &[rows, cols], d.size())?;
                if s.size != 0 || b.size != 0 {
                    return Err(format!(
                        "`{}` is unquantized, but its scales and biases have bytes",
                        w.name
                    ));
                }
                Ok(())
            }
        }
    }

    /// The gate, up and down matrices of one expert whose bytes are `blob`
    /// (the table checked by [`LayerLayout::validate`]; a table that was
    /// not gives an error, never a read outside `blob`).
    pub fn matrices(&self, blob: &Region, group_size: usize) -> Result<[MatrixView; 3]> {
        let bad = |msg: String| Error::format(format!("{EXPERTS_DIR}/{LAYOUT_FILE}"), msg);
        if self.components.len() != 9 {
            return Err(bad(format!("{} components, expected 9", self.components.len())));
        }
        let part = |c: &Component| -> Result<Region> {
            blob.try_sub(c.offset, c.size)
                .ok_or_else(|| bad(format!("`{}` lies outside the expert's {} bytes", c.name, blob.len())))
        };
        let dim = |c: &Component, i: usize| -> Result<usize> {
            c.shape
                .get(i)
                .copied()
                .ok_or_else(|| bad(format!("`{}`: shape {:?} is not 2-D", c.name, c.shape)))
        };
        let mut out = Vec::with_capacity(3);
        for c in self.components.chunks_exact(3) {
            let rows = dim(&c[0], 0)?;
            let data = if c[0].dtype == "U32" {
                if !crate::format::quant::check_bits(self.bits) {
                    return Err(bad(format!("`bits` is {}; packed weights have 2, 4 or 8", self.bits)));
                }
                let cols = dim(&c[0], 1)? * 32 / self.bits as usize;
                if group_size == 0 || !cols.is_multiple_of(group_size) {
                    return Err(bad(format!("`group_size` {group_size} does not divide {cols} columns")));
                }
                let sd = Dtype::parse(&c[1].dtype, &c[1].name)?;
                MatrixView {
                    rows,
                    cols,
                    data: MatrixData::Quant {
                        bits: self.bits,
                        group_size,
                        weight: part(&c[0])?,
                        scales: part(&c[1])?,
                        biases: part(&c[2])?,
                        scale_dtype: sd,
                    },
                }
            } else {
                let dtype = Dtype::parse(&c[0].dtype, &c[0].name)?;
                MatrixView {
                    rows,
                    cols: dim(&c[0], 1)?,
                    data: MatrixData::Float {
                        dtype,
                        data: part(&c[0])?,
                    },
                }
            };
            out.push(data);
        }
        let [g, u, d]: [MatrixView; 3] = out.try_into().map_err(|_| Error::Invalid("expert matrices".into()))?;
        Ok([g, u, d])
    }
}

impl Manifest {
    /// Parse the bytes of a `model_weights.json` read from `path`.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Manifest> {
        serde_json::from_slice(bytes).map_err(|err| Error::Json {
            path: path.to_path_buf(),
            err,
        })
    }

    /// Check every entry against a `model_weights.bin` of `len` bytes: its
    /// range inside the file, a known dtype, a size its shape gives, and
    /// usable `bits` / `group_size` on packed (U32) entries. `path` (the
    /// manifest) is named in errors.
    pub fn validate(&self, path: &Path, len: u64) -> Result<()> {
        let bad = |msg: String| Error::format(path, msg);
        if self.num_tensors != self.tensors.len() {
            return Err(bad(format!(
                "`num_tensors` is {}, but `tensors` has {} entries",
                self.num_tensors,
                self.tensors.len()
            )));
        }
        for (name, t) in &self.tensors {
            let end = t.offset.checked_add(t.size);
            if end.is_none_or(|e| e > len) {
                return Err(bad(format!(
                    "tensor `{name}` (offset {}, size {}) points past the end of {WEIGHTS_FILE} ({len} bytes)",
                    t.offset, t.size
                )));
            }
            let dtype = Dtype::parse(&t.dtype, name)
                .map_err(|_| bad(format!("tensor `{name}`: unknown dtype `{}`", t.dtype)))?;
            let want = t
                .shape
                .iter()
                .try_fold(dtype.size() as u64, |a, &d| a.checked_mul(d as u64));
            if want != Some(t.size) {
                return Err(bad(format!(
                    "tensor `{name}`: shape {:?} of {} needs {} bytes, entry says {}",
                    t.shape,
                    t.dtype,
                    want.map_or_else(|| "more than 2^64".to_string(), |w| w.to_string()),
                    t.size
                )));
            }
            if dtype == Dtype::U32 {
                let bits = t.bits.unwrap_or(0);
                let gs = t.group_size.unwrap_or(0);
                if !crate::format::quant::check_bits(bits) || gs == 0 || t.shape.len() != 2 {
                    return Err(bad(format!(
                        "tensor `{name}`: a packed U32 matrix needs 2-D `shape`, `bits` 2, 4 or 8 and a \
                         non-zero `group_size` (found shape {:?}, bits {:?}, group_size {:?})",
                        t.shape, t.bits, t.group_size
                    )));
                }
                self.validate_packed(name, t).map_err(bad)?;
            }
        }
        Ok(())
    }

    /// A packed entry `X.weight` (bits and group size checked) has the
    /// `X.scales` and `X.biases` that [`WeightsFile::matrix`] reads with
    /// it: float, of one dtype, `[rows, cols / group_size]` each.
    fn validate_packed(&self, name: &str, t: &TensorEntry) -> std::result::Result<(), String> {
        let base = name
            .strip_suffix(".weight")
            .ok_or_else(|| format!("tensor `{name}`: a packed U32 matrix must be named `X.weight`"))?;
        let (bits, gs) = (t.bits.unwrap_or(0) as usize, t.group_size.unwrap_or(0));
        let rows = t.shape[0];
        let cols = t.shape[1].checked_mul(32).map(|c| c / bits.max(1));
        let groups = cols
            .filter(|&c| gs > 0 && c.is_multiple_of(gs))
            .map(|c| c / gs)
            .ok_or_else(|| format!("tensor `{name}`: `group_size` {gs} does not divide its columns"))?;
        let s = self.tensors.get(&format!("{base}.scales"));
        let b = self.tensors.get(&format!("{base}.biases"));
        let (Some(s), Some(b)) = (s, b) else {
            return Err(format!(
                "tensor `{name}` is packed, but `{base}.scales` or `{base}.biases` is missing"
            ));
        };
        let float = |d: &str| matches!(d, "BF16" | "F16" | "F32");
        if s.shape != [rows, groups] || b.shape != s.shape || b.dtype != s.dtype || !float(&s.dtype) {
            return Err(format!(
                "tensor `{name}`: `{base}.scales` and `{base}.biases` must be float, of one dtype and shape [{rows}, {groups}] (found {} {:?} and {} {:?})",
                s.dtype, s.shape, b.dtype, b.shape
            ));
        }
        Ok(())
    }
}

/// The dense weights of a packed model: the manifest and a shared map of
/// `model_weights.bin`.
pub struct WeightsFile {
    pub path: PathBuf,
    pub manifest: Manifest,
    pub map: Arc<dyn AsRef<[u8]> + Send + Sync>,
}

impl WeightsFile {
    /// Open `DIR/model_weights.{bin,json}` and check every manifest entry
    /// against the file's size.
    pub fn open(dir: &Path) -> Result<WeightsFile> {
        let mpath = dir.join(MANIFEST_FILE);
        let bytes = std::fs::read(&mpath).map_err(|e| Error::io(&mpath, e))?;
        let manifest = Manifest::parse(&bytes, &mpath)?;
        let path = dir.join(WEIGHTS_FILE);
        let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
        // SAFETY: the file is opened read-only; moeflux never writes a
        // packed model in place (convert writes a temp dir and renames).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
        WeightsFile::new(path, manifest, Arc::new(map), &mpath)
    }

    /// Weights whose bytes are `data` (the contents of `path`), described
    /// by `manifest` (read from `manifest_path`, checked here).
    pub fn new(
        path: PathBuf,
        manifest: Manifest,
        data: Arc<dyn AsRef<[u8]> + Send + Sync>,
        manifest_path: &Path,
    ) -> Result<WeightsFile> {
        manifest.validate(manifest_path, (*data).as_ref().len() as u64)?;
        Ok(WeightsFile {
            path,
            manifest,
            map: data,
        })
    }

    pub fn entry(&self, name: &str) -> Result<&TensorEntry> {
        self.manifest.tensors.get(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
            where_: Some(MANIFEST_FILE.to_string()),
        })
    }

    pub fn has(&self, name: &str) -> bool {
        self.manifest.tensors.contains_key(name)
    }

    pub fn region(&self, name: &str) -> Result<Region> {
        let t = self.entry(name)?;
        Ok(Region::new(self.map.clone(), t.offset as usize, t.size as usize))
    }

    /// A vector (norm weight, bias) as f32, checked to have `len` elements.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let t = self.entry(name)?;
        if t.shape.iter().product::<usize>() != len {
            return Err(Error::Shape {
                name: name.to_string(),
                expected: vec![len],
                found: t.shape.clone(),
            });
        }
        let dtype = Dtype::parse(&t.dtype, name)?;
        Ok(dtype.to_f32(self.region(name)?.bytes()))
    }

    /// The matrix `X` of logical shape `[rows, cols]`: quantized as
    /// `X.weight` + `X.scales` + `X.biases`, or a float `X.weight`.
    pub fn matrix(&self, base: &str, rows: usize, cols: usize) -> Result<MatrixView> {
        let wname = format!("{base}.weight");
        let w = self.entry(&wname)?;
        let shape_err = |found: &[usize]| Error::Shape {
            name: wname.clone(),
            expected: vec![rows, cols],
            found: found.to_vec(),
        };
        if w.dtype == "U32" {
            let bits = w
                .bits
                .ok_or_else(|| Error::format(MANIFEST_FILE, format!("`{wname}` is U32 without `bits`")))?;
            let gs = w
                .group_size
                .ok_or_else(|| Error::format(MANIFEST_FILE, format!("`{wname}` is U32 without `group_size`")))?;
            if !crate::format::quant::check_bits(bits) || gs == 0 || !cols.is_multiple_of(gs) {
                return Err(Error::format(
                    MANIFEST_FILE,
                    format!("`{wname}`: bits {bits} / group_size {gs} not usable"),
                ));
            }
            if w.shape != [rows, cols * bits as usize / 32] {
                return Err(shape_err(&[
                    w.shape.first().copied().unwrap_or(0),
                    w.shape.get(1).copied().unwrap_or(0) * 32 / bits as usize,
                ]));
            }
            let sname = format!("{base}.scales");
            let s = self.entry(&sname)?;
            let b = self.entry(&format!("{base}.biases"))?;
            if s.shape != [rows, cols / gs] || b.shape != s.shape || b.dtype != s.dtype {
                return Err(Error::Shape {
                    name: sname,
                    expected: vec![rows, cols / gs],
                    found: s.shape.clone(),
                });
            }
            Ok(MatrixView {
                rows,
                cols,
                data: MatrixData::Quant {
                    bits,
                    group_size: gs,
                    weight: self.region(&wname)?,
                    scales: self.region(&sname)?,
                    biases: self.region(&format!("{base}.biases"))?,
                    scale_dtype: Dtype::parse(&s.dtype, &sname)?,
                },
            })
        } else {
            if w.shape != [rows, cols] {
                return Err(shape_err(&w.shape));
            }
            Ok(MatrixView {
                rows,
                cols,
                data: MatrixData::Float {
                    dtype: Dtype::parse(&w.dtype, &wname)?,
                    data: self.region(&wname)?,
                },
            })
        }
    }
}
